"""``flowstate bench load``: N sessions × T turns at once through the official ``openai`` client, on SQLite and on
PostgreSQL side by side: each turn's latency (p50, p99), the turns stored, and whether storage is exact.

The engine is the scripted one (no model time), so what is measured is the endpoint and its storage: session
resolution and loads, persistence, the locks. Each database gets its own server, one after the other, on the same
load; ``--source DIR`` runs the servers from another checkout too (a before/after in one run).

``--tools`` puts the request's grammar in the measure: the server takes grammars as a constraining engine does
(``--script-grammar``: each request's built and checked by llguidance); ``same`` sends one tool schema on every
turn (its grammar compiled once, then cached), ``new`` a schema no earlier turn sent (compiled on that turn). All
the while ``/health`` is called every 20 ms: its p99 is how long the event loop was kept from answering.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flowstate.bench.server import output, serve, stop
from flowstate.bench.table import table
from flowstate.eval.metrics import percentile

TOOLS = ("none", "same", "new")


def tool(tools: str, run: str, i: int, t: int) -> list[dict[str, Any]]:
    """The turn's tools: none, one schema every turn sends, or one whose schema no earlier turn sent."""
    if tools == "none":
        return []
    tag = "x" if tools == "same" else f"{run}_{i}_{t}"
    return [{"type": "function", "function": {"name": "file_note", "description": "File a note.", "parameters": {
        "type": "object", "required": [f"title_{tag}", "tags"], "properties": {
            f"title_{tag}": {"type": "string", "maxLength": 80},
            "tags": {"type": "array", "items": {"enum": ["work", "home", tag]}, "maxItems": 4},
            "due": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}}}}}]


def traffic(url: str, sessions: int, turns: int, tools: str = "none") -> dict[str, Any]:
    """``sessions`` clients at once, ``turns`` turns each, on the server at ``url``: each turn's latency (s), the
    event loop's answer time meanwhile (``/health`` every 20 ms), the wall time, and the run's session prefix."""
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    run = uuid.uuid4().hex[:8]

    def session(i: int) -> list[float]:
        history: list[Any] = [{"role": "system", "content": "Keep notes."}]
        took = []
        for t in range(turns):
            history.append({"role": "user", "content": f"note {t} of session {i}"})
            started = time.perf_counter()
            reply = client.chat.completions.create(model="flowstate", user=f"load-{run}-{i}", messages=history,
                                                   tools=tool(tools, run, i, t))  # type: ignore[arg-type]
            took.append(time.perf_counter() - started)
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
        return took

    health: list[float] = []
    done = threading.Event()

    def probe() -> None:  # the event loop's answer time while the turns run (once at least: quick runs end
        with httpx.Client(base_url=url, timeout=60) as http:  # before a thread's first look)
            while True:
                started = time.perf_counter()
                http.get("/health").raise_for_status()
                health.append(time.perf_counter() - started)
                if done.wait(0.02):
                    return

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(sessions) as pool:
            latencies = [x for per in pool.map(session, range(sessions)) for x in per]
    finally:
        done.set()
        prober.join()
    return {"latencies": latencies, "health": health, "wall": time.perf_counter() - started, "prefix": f"load-{run}-"}


def figures(ran: dict[str, Any]) -> dict[str, Any]:
    """A run's turn latencies and the event loop's answer time, in milliseconds."""
    latencies, health = ran["latencies"], ran["health"]
    return {"health_p99_ms": round(1000 * percentile(health, 99), 1) if health else None,
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * percentile(latencies, 99), 1),
            "max_ms": round(1000 * max(latencies), 1), "turns_per_s": round(len(latencies) / ran["wall"], 1)}


def measure(db: str, label: str, sessions: int, turns: int, source: str | None,
            progress: Callable[[str], None], tools: str = "none") -> dict[str, Any]:
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(Path(tmp), [output(assistant_message={"content": "noted"})] * (sessions * turns),
                          db or str(Path(tmp) / "load.db"), ["--script-grammar"] if tools != "none" else [],
                          source=source)
        try:
            ran = traffic(url, sessions, turns, tools)
            listed = httpx.get(url + "/v1/sessions", timeout=120).json()["data"]
            mine = {d["id"]: d["requests"] for d in listed if d["id"].startswith(ran["prefix"])}
        finally:
            stop(proc)
    progress(f"{label}: {len(ran['latencies'])} turns in {ran['wall']:.1f} s")
    return {"database": label, "source": source or "this checkout", "tools": tools, "sessions": sessions,
            "turns": turns,
            **figures(ran), "stored_exactly": len(mine) == sessions and all(n == turns for n in mine.values())}


def bench_load(sessions: int, turns: int, databases: Sequence[tuple[str, str]], sources: Sequence[str | None],
               progress: Callable[[str], None], tools: Sequence[str] = ("none",)) -> list[dict[str, Any]]:
    """Every (source, database, tools) in turn; ``databases``: (label, postgresql:// URL, or "" for a fresh SQLite
    file)."""
    unknown = set(tools) - set(TOOLS)
    if unknown:
        raise ValueError(f"--tools takes {', '.join(TOOLS)}, not {', '.join(sorted(unknown))}")
    return [measure(db, label, sessions, turns, source, progress, kind) for source in sources
            for label, db in databases for kind in tools]


HEAD = ["source", "database", "tools", "sessions", "turns", "p50_ms", "p99_ms", "max_ms", "health_p99_ms",
        "turns_per_s", "stored_exactly"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
