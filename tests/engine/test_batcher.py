"""The vLLM engine's batcher: concurrent calls share generate() batches; one bad call fails only itself.

vLLM itself is exercised in test_vllm.py; here a stand-in ``LLM`` records the batches it is given.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from engine.vllm import _Batcher


class RecordingLLM:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.lock = threading.Lock()

    def generate(self, prompts: list[str], params: Any, use_tqdm: bool = False) -> list[str]:
        assert self.lock.acquire(blocking=False), "vllm.LLM driven by two threads at once"
        try:
            self.batches.append(list(prompts))
            time.sleep(0.05)
            if any(p.startswith("bad") for p in prompts):
                raise ValueError("bad grammar")
            return [p.upper() for p in prompts]
        finally:
            self.lock.release()


def test_concurrent_calls_are_batched_and_answered_in_order() -> None:
    llm = RecordingLLM()
    batcher = _Batcher(llm)
    prompts = [f"p{i}" for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(lambda p: batcher.run(p, None), prompts))
    assert outputs == [p.upper() for p in prompts]
    assert sorted(p for b in llm.batches for p in b) == sorted(prompts)
    assert max(len(b) for b in llm.batches) > 1 and len(llm.batches) < 16


def test_a_failing_call_fails_alone() -> None:
    llm = RecordingLLM()
    batcher = _Batcher(llm)
    barrier = threading.Barrier(4)

    def call(p: str) -> str:
        barrier.wait()
        return str(batcher.run(p, None))

    with ThreadPoolExecutor(4) as pool:
        futures = {p: pool.submit(call, p) for p in ("a", "bad", "c", "d")}
    with pytest.raises(ValueError, match="bad grammar"):
        futures["bad"].result()
    assert [futures[p].result() for p in "acd"] == ["A", "C", "D"]
