"""The llama.cpp backend: a GGUF model on ``llama_cpp.Llama``, grammars through llguidance's token masks.

The default model is the embedded SmolLM2-135M-Instruct GGUF (the same file the transformers
engine loads); any ``.gguf`` path can be named. llama.cpp keeps the KV cache of the previous call
and reuses its longest common token prefix (``cached_tokens``). A grammar is enforced by an
llguidance matcher that masks the logits before every sampled token, so the output is always in
the grammar's language; the tokens it forces are appended in one forward pass (``fast_forward``). Prompts are
rendered with the GGUF's own chat template (template variables such as ``enable_thinking`` pass through
``chat_template_kwargs``). Without ``threads``, each call runs on the cores of this process's affinity that no
other runnable task holds at that moment (``free_cores``).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.base import ALL_SAMPLING, Capabilities, Decoding, Engine, Generation, Message, OnText, Sampling, Usage
from engine.chat import check_options, completion_budget
from engine.distribution import install_hint
from engine.errors import EngineConfigError, EngineError
from engine.lookup import Lookup, Speculation, greedy, sampler, verify
from engine.priority import PriorityLock
from engine.purpose import STEP, Purpose
from engine.text import common_prefix

_MATCHERS_CACHE = 32
_LOADING = threading.Lock()


def cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's, a cgroup's or ``taskset``'s limit), not
    the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity call on this platform
        return os.cpu_count() or 1


def free_cores(total: int, loadavg: str = "/proc/loadavg") -> int:
    """Of ``total`` cores, those no other runnable task holds now (Linux's count of runnable tasks in
    ``/proc/loadavg``, less the thread asking): llama.cpp's threads wait for each other at every operation, so a
    thread that shares its core with another process stalls them all."""
    try:
        with open(loadavg, encoding="ascii") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return total
    return max(1, min(total, total - (running - 1)))


@contextmanager
def _model_params(extra_buffers: bool) -> Iterator[None]:
    """Load with llama.cpp's extra weight buffer types (AMX, repacked layouts) on or off.

    llama-cpp-python does not expose ``use_extra_bufts``; its constructor reads the defaults from
    ``llama_model_default_params``, so that function is wrapped while one model loads. (With them on,
    batched prompt decoding crashes with SIGSEGV on this project's AMX machines, which run sandboxed.)
    """
    import llama_cpp.llama_cpp as capi

    if extra_buffers:
        yield
        return
    default = capi.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    with _LOADING:
        capi.llama_model_default_params = params
        try:
            yield
        finally:
            capi.llama_model_default_params = default


def lltokenizer(vocab: Any) -> Any:
    """llguidance's tokenizer of a llama.cpp vocabulary (one per model: grammars compile against it)."""
    import llguidance.llamacpp

    with warnings.catch_warnings():  # llguidance reads the vocabulary through a deprecated call, once per token
        warnings.simplefilter("ignore", DeprecationWarning)
        return llguidance.llamacpp.lltokenizer_from_vocab(vocab)


class Vocabulary:
    """A GGUF model's tokenizer from its vocabulary alone (no weights loaded): counts tokens as the model would
    (the evaluator's reference policies, ``flowstate eval --count-tokens embedded``), and how many tokens of an
    output a grammar forces (what an engine that fast-forwards appends without decoding)."""

    def __init__(self, model: str | None = None) -> None:
        try:
            import llama_cpp
            import llguidance
            import llguidance.llamacpp
        except ImportError as exc:
            raise EngineConfigError(f"counting tokens with a GGUF vocabulary needs llama-cpp-python ({exc.name}): "
                                    f"{install_hint('embedded')}") from exc
        path, _ = resolve_gguf(model)
        try:
            self._llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineConfigError(f"llama.cpp cannot load the vocabulary of {path}: {exc}") from exc
        self._llg = llguidance
        self._tokenizer = lltokenizer(llama_cpp.llama_model_get_vocab(self._llm.model))
        self._lock = threading.Lock()

    def __call__(self, text: str) -> list[int]:
        with self._lock:
            return list(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def forced(self, grammar: str, text: str) -> int:
        """Of ``text``'s tokens, those ``grammar`` forces where they stand (llguidance's fast-forward tokens, where
        the text's own tokens are the same); counting stops where the text leaves the grammar."""
        tokens = self(text)
        matcher = self._llg.LLMatcher(self._tokenizer, self._llg.grammar_from("lark", grammar), log_level=0)
        forced = i = 0
        while i < len(tokens) and not matcher.is_stopped():
            ff = list(matcher.compute_ff_tokens())
            if ff and tokens[i:i + len(ff)] == ff:
                matcher.consume_tokens(ff)
                forced, i = forced + len(ff), i + len(ff)
            elif matcher.consume_token(tokens[i]):
                i += 1
            else:
                break
        return forced


def vocabulary(model: str | None = None) -> Vocabulary:
    """The tokenizer of a GGUF model's vocabulary alone (``Vocabulary``)."""
    return Vocabulary(model)


def resolve_gguf(model: str | None) -> tuple[str, bool]:
    """(path of the .gguf file, whether it is the embedded model)."""
    if model is None:
        from engine.transformers import embedded_model

        folder, name = embedded_model()
        return str(Path(folder) / name), True
    path = Path(model).expanduser()
    if not (path.is_file() and path.suffix == ".gguf"):
        raise EngineConfigError(f"model {model!r} is not a .gguf file (the llamacpp engine loads GGUF models)")
    return str(path), False


class _Output:
    """One generation's tokens as they come: streamed to ``on_text`` as text, with the grammar's forced tokens
    appended at once where a matcher is given (fast-forward)."""

    def __init__(self, llm: Any, matcher: Any, budget: int, on_text: OnText | None) -> None:
        import codecs

        self.llm, self.matcher, self.budget, self.on_text = llm, matcher, budget, on_text
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokens: list[int] = []
        self.forced = 0

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def emit(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        if self.on_text is not None:
            piece = self.decoder.decode(self.llm.detokenize(tokens, special=False))
            if piece:
                self.on_text(piece)

    def fast_forward(self) -> bool:
        """Append the tokens the grammar forces now (they are evaluated with the next batch, in one forward pass,
        instead of one decode step each); whether any were."""
        ff = list(self.matcher.compute_ff_tokens())[: self.budget - len(self.tokens)] if self.matcher else []
        if not ff:
            return False
        if not self.matcher.consume_tokens(ff):
            raise EngineError(f"llguidance refused its own forced tokens: {self.matcher.get_error()}")
        self.forced += len(ff)
        self.emit(ff)
        return True


class _Logits:
    """A llama-cpp-python logits processor: the repetition penalty as transformers applies it (over every
    token of the context, prompt included, so both CPU engines sample alike), then the grammar's mask."""

    def __init__(self, matcher: Any, vocab: int, penalty: float) -> None:
        import numpy as np

        self._np = np
        self.matcher = matcher  # advanced by the generation loop after every sampled token
        self.penalty = penalty
        self.bitmask = np.zeros(((vocab + 31) // 32,), dtype=np.int32)
        self.mask_s = 0.0  # computing and applying the masks, over the call

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        np = self._np
        if self.penalty != 1.0:
            seen = np.unique(input_ids)
            seen = seen[seen < len(scores)]
            picked = scores[seen]
            scores[seen] = np.where(picked > 0, picked / self.penalty, picked * self.penalty)
        if self.matcher is None:
            return scores
        started = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        allowed = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")[: len(scores)].astype(bool)
        masked = np.where(allowed, scores, -np.inf).astype(scores.dtype, copy=False)
        self.mask_s += time.perf_counter() - started
        return masked


class LlamaCppEngine(Engine):
    """Local generation with llama.cpp on CPU (or any llama.cpp build), grammars through llguidance."""

    name = "llamacpp"
    options = frozenset({"model", "temperature", "top_p", "max_tokens", "repetition_penalty", "threads",
                         "threads_batch", "batch_size", "context", "seed", "extra_buffers", "chat_template",
                         "chat_template_kwargs", "fast_forward", "speculate"})

    def __init__(
        self,
        model: str | None = None,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 1024,
        repetition_penalty: float = 1.1,
        threads: int | None = None,
        threads_batch: int | None = None,
        batch_size: int = 512,
        context: int | None = None,
        seed: int = 0,
        extra_buffers: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        fast_forward: bool = True,
        speculate: str | None = None,
    ) -> None:
        """``fast_forward``: tokens the grammar forces are appended in one forward pass, not decoded one by one.
        ``speculate``: ``lookup:K`` drafts up to K tokens a step from the prompt and output so far and verifies them
        in one forward pass (``engine/lookup.py``); off by default."""
        self.speculation = Speculation.parse(speculate)
        try:
            import llama_cpp
            import llguidance
            import llguidance.llamacpp
        except ImportError as exc:
            raise EngineConfigError(f"the llamacpp engine needs llama-cpp-python ({exc.name} is missing): "
                                    f"{install_hint('embedded')}") from exc
        path, embedded = resolve_gguf(model)
        self.capabilities = Capabilities(grammar=True, streams=True, sampling=ALL_SAMPLING, embedded=embedded,
                                         salts=True, priority=True, shares=True)
        self.model_name = Path(path).name
        self._cores = cores()
        self._adaptive = threads is None and threads_batch is None  # threads given: kept as given
        self._threads = threads or self._cores
        try:
            with _model_params(extra_buffers):
                self.llm = llama_cpp.Llama(
                    model_path=path, n_ctx=context or 0, n_batch=batch_size, n_threads=self._threads,
                    n_threads_batch=threads_batch or self._threads, seed=seed, verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineConfigError(f"llama.cpp cannot load {path}: {exc}") from exc
        self._check_speculation(batch_size)
        self.context: int = self.llm.n_ctx()
        self._vocab = self.llm.n_vocab()
        self._eos = self.llm.token_eos()
        self._vocab_ptr = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._llguidance = llguidance
        self._tokenizer = lltokenizer(self._vocab_ptr)
        self._grammars: dict[str, Any] = {}  # grammar text -> compiled llguidance grammar
        self._formatter = self._chat_formatter(chat_template, path)
        self.decoding, self.max_tokens = Decoding(temperature, top_p, seed), max_tokens
        self.repetition_penalty, self.fast_forward = repetition_penalty, fast_forward
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._lock = PriorityLock()  # one model, one KV cache: calls from many threads take turns, by priority
        self._salt: str | None = None  # the cache partition the KV cache holds a prompt of
        self._shared: list[int] = []  # the prompt opening every partition sends alike (share_prefix)

    def _check_speculation(self, batch_size: int) -> None:
        if self.speculation is None:
            return
        if batch_size <= self.speculation.k:
            raise EngineConfigError(f"speculate=lookup:{self.speculation.k} verifies {self.speculation.k + 1} tokens "
                                    f"in one batch: batch_size must exceed {self.speculation.k}, not {batch_size}")
        if self.llm._is_recurrent or self.llm._is_hybrid:
            raise EngineConfigError(f"speculate needs a KV cache that can drop rejected draft tokens; "
                                    f"{self.model_name} is a recurrent or hybrid model, whose state cannot be rolled "
                                    "back here")

    def _chat_formatter(self, chat_template: str | None, path: str) -> Any:
        """The model's chat template (or the one given), rendered as llama-cpp-python renders it."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = chat_template or self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise EngineConfigError(f"{path} carries no chat template (tokenizer.chat_template); give one with "
                                    "chat_template")

        def piece(token: int) -> str:
            return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

        return Jinja2ChatFormatter(template, eos_token=piece(self._eos), bos_token=piece(self.llm.token_bos()))

    @classmethod
    def from_options(cls, **options: Any) -> LlamaCppEngine:
        """Factory used by ``engine.load('llamacpp', model=..., ...)``; unknown options are refused."""
        return cls(**check_options(cls.name, options, set(cls.options)))

    # -- prompt -------------------------------------------------------------------------

    def render(self, messages: Sequence[Message]) -> str:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        prompt: str = self._formatter(messages=chat, **self.chat_template_kwargs).prompt
        return prompt

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def count_tokens(self, text: str) -> int:
        return len(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    # -- grammar -------------------------------------------------------------------------

    def _matcher(self, grammar: str) -> Any:
        """A fresh matcher for one call; grammars are checked once and kept (the loop reuses them)."""
        llg = self._llguidance
        compiled = self._grammars.get(grammar)
        if compiled is None:
            compiled = llg.grammar_from("lark", grammar)
            try:
                error = llg.LLMatcher.validate_grammar(compiled, self._tokenizer)
            except ValueError as exc:
                error = str(exc)
            if error:
                raise EngineConfigError(f"grammar refused by llguidance: {error}")
            if len(self._grammars) >= _MATCHERS_CACHE:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[grammar] = compiled
        matcher = llg.LLMatcher(self._tokenizer, compiled, log_level=0)
        if matcher.is_error():
            raise EngineConfigError(f"grammar refused by llguidance: {matcher.get_error()}")
        return matcher

    # -- generation -----------------------------------------------------------------------

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        prompt = self.tokenize(self.render(messages))
        matcher = self._matcher(grammar) if grammar else None
        with self._lock.hold(priority):
            if cache_salt != self._salt:  # the KV cache is another partition's (a tenant's): only the shared opening
                keep = common_prefix(self.llm.input_ids[: self.llm.n_tokens].tolist(), self._shared)
                self.llm.n_tokens = keep  # of it is reused
                self.llm._ctx.kv_cache_seq_rm(-1, keep, -1)
                self._salt = cache_salt
            return self._generate(prompt, matcher, max_tokens, on_text, sampling or Sampling())

    def share_prefix(self, messages: Sequence[Message]) -> None:
        """The tokens every partition's prompt opens with: ``messages`` rendered, up to the last token a longer
        conversation renders alike (the chat template closes the last message; that close is not shared)."""
        alone = self.tokenize(self.render(messages))
        longer = self.tokenize(self.render([*messages, Message("user", "\x00")]))
        self._shared = alone[: common_prefix(alone, longer)]

    def _generate(
        self, prompt: list[int], matcher: Any, max_tokens: int | None, on_text: OnText | None, sampling: Sampling,
    ) -> Generation:
        import llama_cpp

        s = sampling.over(self.decoding)
        self.llm.set_seed(s.seed if s.seed is not None else 0)
        if self._adaptive:  # as many threads as cores are free now: none waits on a core another process holds
            threads = free_cores(self._cores)
            if threads != self._threads:
                llama_cpp.llama_set_n_threads(self.llm.ctx, threads, threads)
                self._threads = threads
        budget = completion_budget(max_tokens or self.max_tokens, len(prompt), self.context)
        cached = min(common_prefix(self.llm.input_ids[: self.llm.n_tokens].tolist(), prompt), len(prompt) - 1)
        processors, logits = None, None
        if matcher is not None or self.repetition_penalty != 1.0:
            logits = _Logits(matcher, self._vocab, self.repetition_penalty)
            processors = llama_cpp.LogitsProcessorList([logits])
        run = _Output(self.llm, matcher if self.fast_forward else None, budget, on_text)
        started = time.perf_counter()
        drafted = accepted = 0
        try:
            if self.speculation is not None:
                finish, first, drafted, accepted = self._speculate(prompt, run, matcher, s, logits)
            else:
                finish, first = self._decode(prompt, run, matcher, s.temperature, s.top_p, processors)
        except EngineError:
            self.llm.reset()
            raise
        except Exception as exc:
            self.llm.reset()
            raise EngineError(f"llama.cpp generation failed: {type(exc).__name__}: {exc}") from exc
        end = time.perf_counter()
        first = first or end
        text = self.llm.detokenize(run.tokens, special=False).decode("utf-8", errors="replace")
        usage = Usage(prompt_tokens=len(prompt), cached_tokens=max(cached, 0), completion_tokens=len(run.tokens),
                      ttft_s=first - started, decode_s=end - first, forced_tokens=run.forced,
                      mask_s=logits.mask_s if logits is not None else 0.0, drafted_tokens=drafted,
                      accepted_tokens=accepted)
        return Generation(text=text, usage=usage, finish_reason=finish)

    def _decode(self, prompt: list[int], run: _Output, matcher: Any, temperature: float, top_p: float,
                processors: Any) -> tuple[str, float | None]:
        """Sample until the end, the budget or the grammar's stop; the finish reason and the first token's time.

        Between sampled tokens the grammar's forced tokens are appended (``_Output.fast_forward``); then decoding
        restarts on the longer context, whose prefix is cached (llama-cpp-python's generate reuses it and evaluates
        the new tokens in one batch)."""
        import llama_cpp

        first: float | None = None
        finish = "length"
        run.fast_forward()  # an output's opening is usually forced (a block's tag)
        while finish == "length" and not run.full and not (matcher is not None and matcher.is_stopped()):
            for token in self.llm.generate(
                prompt + run.tokens, temp=temperature, top_p=top_p, top_k=0, min_p=0.0,
                repeat_penalty=1.0, logits_processor=processors, reset=True,
            ):
                first = first or time.perf_counter()
                if llama_cpp.llama_vocab_is_eog(self._vocab_ptr, token):
                    finish = "stop"
                    break
                if matcher is not None and not matcher.consume_token(int(token)):
                    raise EngineError(f"llguidance refused sampled token {token}: {matcher.get_error()}")
                run.emit([int(token)])
                if matcher is not None and matcher.is_stopped():
                    finish = "stop"
                    break
                if run.full or run.fast_forward():
                    break
        if matcher is not None and matcher.is_stopped():
            finish = "stop"
        return finish, first

    def _speculate(self, prompt: list[int], run: _Output, matcher: Any, s: Decoding, logits: _Logits | None
                   ) -> tuple[str, float | None, int, int]:
        """Decode with drafts from the prompt (``engine/lookup.py``): each forward pass evaluates the tokens not yet
        evaluated (the last chosen one and the grammar's forced ones) and a draft of up to K tokens, and keeps the
        draft's prefix the verifier chooses itself, then the verifier's own next token. The finish reason, the first
        token's time, and the tokens drafted and kept."""
        import llama_cpp
        import numpy as np

        assert self.speculation is not None
        llm, lookup = self.llm, Lookup(self.speculation, prompt)
        choose = greedy if s.temperature == 0 else sampler(s.temperature, s.top_p, np.random.default_rng(s.seed or 0))
        llm.n_tokens = min(common_prefix(llm.input_ids[: llm.n_tokens].tolist(), prompt), len(prompt) - 1)
        llm.eval(prompt[llm.n_tokens:-1])  # the prompt but its last token, which goes with the first draft
        first: float | None = None
        drafted = kept_total = 0
        run.fast_forward()
        while not run.full and not (matcher is not None and matcher.is_stopped()):
            context = prompt + run.tokens
            lookup.extend(context[len(lookup.tokens):])
            draft = lookup.propose(limit=run.budget - len(run.tokens) - 1)
            ends = (i for i, t in enumerate(draft) if llama_cpp.llama_vocab_is_eog(self._vocab_ptr, t))
            draft = draft[: next(ends, len(draft))]
            if matcher is not None and draft:
                draft = draft[: matcher.validate_tokens(draft)]
            pending = context[llm.n_tokens:]
            rows = self._forward(pending + draft, len(draft) + 1)
            seen = np.array(context, dtype=np.int64)

            def scores(i: int) -> Any:
                row = rows[i].copy()
                return logits(np.concatenate([seen, draft[:i]]) if i else seen, row) if logits is not None else row

            def keep(row: Any, d: int | None) -> tuple[bool, int]:
                kept, token = choose(row, d)
                if kept and matcher is not None and not matcher.consume_token(d):
                    raise EngineError(f"llguidance refused a draft token it had validated: {matcher.get_error()}")
                return kept, token

            kept, token = verify(draft, scores, keep)
            drafted, kept_total = drafted + len(draft), kept_total + kept
            first = first or time.perf_counter()
            llm.n_tokens -= len(draft) - kept  # the rejected drafts leave the KV cache
            llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
            if kept:
                run.emit(draft[:kept])
            if llama_cpp.llama_vocab_is_eog(self._vocab_ptr, token):
                return "stop", first, drafted, kept_total
            if run.full:
                break
            if matcher is not None and not matcher.consume_token(token):
                raise EngineError(f"llguidance refused sampled token {token}: {matcher.get_error()}")
            run.emit([token])
            if matcher is None or not matcher.is_stopped():
                run.fast_forward()
        stopped = matcher is not None and matcher.is_stopped()
        return ("stop" if stopped else "length"), first, drafted, kept_total

    def _forward(self, tokens: list[int], rows: int) -> Any:
        """Evaluate ``tokens`` after the cached context, in one batch where they fit; the logits of the last ``rows``
        of them (rows × vocabulary)."""
        import numpy as np

        llm = self.llm
        if len(tokens) > llm.n_batch:  # a long forced run: its head first, as llama-cpp-python evaluates a prompt
            llm.eval(tokens[:-rows])
            tokens = tokens[-rows:]
        n_past = llm.n_tokens
        llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
        llm._batch.set_batch(tokens, n_past, logits_all=False)
        for i in range(len(tokens) - rows, len(tokens)):
            llm._batch.batch.logits[i] = True
        llm._ctx.decode(llm._batch)
        llm.input_ids[n_past:n_past + len(tokens)] = tokens
        llm.n_tokens = n_past + len(tokens)
        out = np.empty((rows, self._vocab), dtype=np.float32)
        for r in range(rows):
            out[r] = np.ctypeslib.as_array(llm._ctx.get_logits_ith(len(tokens) - rows + r), shape=(self._vocab,))
        return out
