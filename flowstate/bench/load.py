"""``flowstate bench load``: N sessions × T turns at once through the official ``openai`` client, on SQLite and on
PostgreSQL side by side: each turn's latency (p50, p99), the turns stored, and whether storage is exact.

The engine is the scripted one (no model time), so what is measured is the endpoint and its storage: session
resolution and loads, persistence, the locks. Each database gets its own server, one after the other, on the same
load; ``--source DIR`` runs the servers from another checkout too (a before/after in one run).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flowstate.bench.server import output, serve, stop
from flowstate.bench.table import table
from flowstate.eval.metrics import percentile


def measure(db: str, label: str, sessions: int, turns: int, source: str | None,
            progress: Callable[[str], None]) -> dict[str, Any]:
    import httpx
    from openai import OpenAI

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(Path(tmp), [output(assistant_message={"content": "noted"})] * (sessions * turns),
                          db or str(Path(tmp) / "load.db"), source=source)
        try:
            client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
            run = uuid.uuid4().hex[:8]

            def session(i: int) -> list[float]:
                history: list[Any] = [{"role": "system", "content": "Keep notes."}]
                took = []
                for t in range(turns):
                    history.append({"role": "user", "content": f"note {t} of session {i}"})
                    started = time.perf_counter()
                    reply = client.chat.completions.create(model="flowstate", user=f"load-{run}-{i}", messages=history)
                    took.append(time.perf_counter() - started)
                    history.append({"role": "assistant", "content": reply.choices[0].message.content})
                return took

            started = time.perf_counter()
            with ThreadPoolExecutor(sessions) as pool:
                latencies = [x for per in pool.map(session, range(sessions)) for x in per]
            wall = time.perf_counter() - started
            listed = httpx.get(url + "/v1/sessions", timeout=120).json()["data"]
            mine = {d["id"]: d["requests"] for d in listed if d["id"].startswith(f"load-{run}-")}
        finally:
            stop(proc)
    progress(f"{label}: {len(latencies)} turns in {wall:.1f} s")
    return {"database": label, "source": source or "this checkout", "sessions": sessions, "turns": turns,
            "p50_ms": round(1000 * statistics.median(latencies), 1), "p99_ms": round(1000 * percentile(latencies, 99), 1),
            "max_ms": round(1000 * max(latencies), 1), "turns_per_s": round(len(latencies) / wall, 1),
            "stored_exactly": len(mine) == sessions and all(n == turns for n in mine.values())}


def bench_load(sessions: int, turns: int, databases: Sequence[tuple[str, str]], sources: Sequence[str | None],
               progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every (source, database) pair in turn; ``databases``: (label, postgresql:// URL, or "" for a fresh SQLite
    file)."""
    return [measure(db, label, sessions, turns, source, progress) for source in sources for label, db in databases]


HEAD = ["source", "database", "sessions", "turns", "p50_ms", "p99_ms", "max_ms", "turns_per_s", "stored_exactly"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
