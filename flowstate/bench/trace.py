"""``flowstate bench trace FILE --base-url URL --sessions N``: an evaluation's recorded model calls replayed
against any OpenAI-compatible server, each method's traces on their own, N sessions at once.

A session's calls go in order, each after the previous one ended; N sessions run at once. Every output is
forced to its recorded length (``max_tokens`` = ``min_tokens`` = n with ``ignore_eos``, as ``vllm bench serve``
does), so the server does the recorded work whatever the model says: what differs between methods is only the
prompts and output lengths their memory produced. Per method and N: wall time, output throughput, TTFT and
TPOT (p50 / p99), and from the server's Prometheus ``/metrics`` (vLLM's) the prefix-cache hit rate and
preemptions over the replay.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from flowstate.bench.table import table
from flowstate.eval.metrics import percentile
from flowstate.eval.trace import TracedCall

METRICS = {"hits": "vllm:prefix_cache_hits", "queries": "vllm:prefix_cache_queries",
           "preemptions": "vllm:num_preemptions"}
"""The vLLM counters a replay reads (before and after), by what they count."""


def scrape(base_url: str) -> dict[str, float]:
    """The server's counters of ``METRICS`` (summed over their labels); {} where it serves no /metrics."""
    url = re.sub(r"/v1/?$", "", base_url.rstrip("/")) + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return {}
    out: dict[str, float] = {}
    for key, name in METRICS.items():
        values = re.findall(rf"^{re.escape(name)}(?:_total)?(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
        if values:
            out[key] = sum(float(v) for v in values)
    return out


@dataclass(frozen=True)
class Timing:
    ttft_s: float
    end_s: float
    output_tokens: int


def replay_call(client: Any, model: str, call: TracedCall) -> Timing:
    """One call, streamed, its output forced to the recorded length."""
    n = max(call.completion_tokens, 1)
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    stream = client.chat.completions.create(
        model=model, messages=[{"role": m.role, "content": m.content} for m in call.messages], max_tokens=n,
        temperature=0.0, stream=True, stream_options={"include_usage": True},
        extra_body={"min_tokens": n, "ignore_eos": True})
    for chunk in stream:
        if chunk.choices and first is None and (chunk.choices[0].delta.content or "") != "":
            first = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return Timing((first or end) - started, end - started, tokens)


def replay(client: Any, model: str, sessions: dict[str, list[TracedCall]], concurrency: int,
           base_url: str) -> dict[str, Any]:
    """Every session of one method, ``concurrency`` at once; the figures of the replay."""
    before = scrape(base_url)
    timings: list[Timing] = []
    lock = threading.Lock()
    expected = sum(c.completion_tokens for calls in sessions.values() for c in calls)

    def one(calls: Sequence[TracedCall]) -> None:
        for call in calls:
            t = replay_call(client, model, call)
            with lock:
                timings.append(t)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, sessions.values()))
    wall = time.perf_counter() - started
    after = scrape(base_url)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    output = sum(t.output_tokens for t in timings)
    tpot = [(t.end_s - t.ttft_s) / (t.output_tokens - 1) for t in timings if t.output_tokens > 1]
    return {
        "sessions": len(sessions), "concurrency": concurrency, "calls": len(timings), "wall_s": round(wall, 2),
        "output_tokens": output, "recorded_tokens": expected, "output_tok_s": round(output / wall, 1) if wall else 0.0,
        "ttft_p50_s": round(percentile([t.ttft_s for t in timings], 50), 3),
        "ttft_p99_s": round(percentile([t.ttft_s for t in timings], 99), 3),
        "tpot_p50_ms": round(1000 * percentile(tpot, 50), 1), "tpot_p99_ms": round(1000 * percentile(tpot, 99), 1),
        "prefix_hit_rate": round(delta["hits"] / delta["queries"], 3) if delta.get("queries") else None,
        "preemptions": int(delta["preemptions"]) if "preemptions" in delta else None,
    }


def bench_trace(traces: dict[str, dict[str, list[TracedCall]]], client: Any, model: str, base_url: str,
                concurrency: Sequence[int], progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Each method's sessions replayed at each concurrency in turn, one method at a time."""
    rows = []
    for n in concurrency:
        for strategy, sessions in traces.items():
            progress(f"{strategy}: {len(sessions)} sessions, {n} at once")
            rows.append({"strategy": strategy, **replay(client, model, sessions, n, base_url)})
    return rows


HEAD = ["strategy", "sessions", "concurrency", "calls", "wall_s", "output_tokens", "recorded_tokens", "output_tok_s",
        "ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "tpot_p99_ms", "prefix_hit_rate", "preemptions"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
