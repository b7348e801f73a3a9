"""``flowstate bench sessions``: what a server's idle sessions hold in memory, with and without a byte budget.

Each of N sessions makes one request whose client tool returns a large result (``--result-mb``), through the
official ``openai`` client against a real ``flowstate serve`` (the scripted engine, its own SQLite file); the
server's resident memory is read from ``/proc`` after all of them, and again after every session is deleted.
Each ``--session-memory`` setting runs its own server, one after the other, on the same load.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowstate.bench.server import output, rss_mb, serve, stop
from flowstate.bench.table import table

TOOL = {"type": "function", "function": {"name": "fetch", "description": "Fetch the report.",
                                         "parameters": {"type": "object", "properties": {}}}}


def measure(sessions: int, result_mb: float, budget_mb: float | None,
            progress: Callable[[str], None]) -> dict[str, Any]:
    """One server, ``sessions`` sessions each holding one ``result_mb`` tool result; its memory before, after, and
    after deleting them."""
    import httpx
    from openai import OpenAI

    result = json.dumps({"report": "x" * int(result_mb * (1 << 20))})
    outputs = [output(tool_calls=[{"name": "fetch", "arguments": {}}]), output(assistant_message={"content": "read"})]
    memory = str(budget_mb if budget_mb is not None else 1 << 20)  # unbounded: a budget no load reaches
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(Path(tmp), outputs * sessions, str(Path(tmp) / "bench.db"),
                          ["--session-memory", memory, "--max-body-mb", "64"])
        try:
            client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
            before = rss_mb(proc.pid)
            started = time.monotonic()
            for i in range(sessions):
                name = f"big-{i}"
                reply = client.chat.completions.create(model="flowstate", user=name, tools=[TOOL],  # type: ignore[list-item]
                                                       messages=[{"role": "user", "content": "Read the report."}])
                call = (reply.choices[0].message.tool_calls or [])[0]
                client.chat.completions.create(model="flowstate", user=name, tools=[TOOL],  # type: ignore[list-item]
                                               messages=[{"role": "tool", "tool_call_id": call.id, "content": result}])
                if (i + 1) % 25 == 0:
                    progress(f"session memory {budget_mb or 'unbounded'} MiB: {i + 1}/{sessions} sessions, "
                             f"server RSS {rss_mb(proc.pid):.0f} MB")
            elapsed = time.monotonic() - started
            held = rss_mb(proc.pid)
            for i in range(sessions):
                httpx.delete(f"{url}/v1/sessions/big-{i}", timeout=60).raise_for_status()
            time.sleep(1.0)
            after = rss_mb(proc.pid)
        finally:
            stop(proc)
    return {"session_memory_mb": budget_mb if budget_mb is not None else "unbounded", "sessions": sessions,
            "result_mb": result_mb, "rss_start_mb": round(before), "rss_held_mb": round(held),
            "rss_after_delete_mb": round(after), "held_over_start_mb": round(held - before),
            "seconds": round(elapsed, 1)}


def bench_sessions(sessions: int, result_mb: float, budgets: Sequence[float | None],
                   progress: Callable[[str], None]) -> list[dict[str, Any]]:
    if not os.path.exists("/proc/self/status"):
        raise RuntimeError("flowstate bench sessions reads a server's memory from /proc (Linux)")
    return [measure(sessions, result_mb, b, progress) for b in budgets]


HEAD = ["session_memory_mb", "sessions", "result_mb", "rss_start_mb", "rss_held_mb", "held_over_start_mb",
        "rss_after_delete_mb", "seconds"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
