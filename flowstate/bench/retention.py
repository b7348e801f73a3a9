"""``flowstate bench retention``: what retention's sweep costs the turns that run while it works, on SQLite and
PostgreSQL side by side.

Per database, two fresh databases are seeded alike with ``expired`` sessions (one request each: a state, a
transcript) whose clocks are set 40 days back, and a server on the scripted engine serves the same traffic on each
(``sessions`` clients at once, ``turns`` turns each): once with retention off, once with ``--retention idle=30d``,
whose sweep starts as the server does and removes the seeded sessions 20 a transaction while the traffic runs. Rows:
turn p50/p99/max and /health p99 off and on, how many sessions the sweep had removed when the traffic ended, and
whether it then removed them all and nothing of the traffic's."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowstate.bench.load import figures, traffic
from flowstate.bench.server import output, serve, stop
from flowstate.bench.table import table
from flowstate.nodes import Node, StateType
from flowstate.store.repository import Repository, Transcript

DAY_S = 86_400


def seed(target: str, expired: int) -> None:
    """``expired`` sessions of one request each, last active 40 days ago."""
    with Repository.open(target) as repo:
        for i in range(expired):
            node = Node(id="kn_1", type=StateType.KNOWLEDGE, summary=f"old note {i}", value={"i": i}, request=1)
            repo.persist_request(f"old-{i}", 1, f"note {i}", "noted", [node], {},
                                 transcript=Transcript([{"role": "user", "content": f"note {i}"}], {}))
        then = int(time.time()) - 40 * DAY_S
        with repo._write("age the seeded sessions") as conn:  # the bench's clock: the stored times moved back
            conn.execute("UPDATE sessions SET created_at = ?, active_at = ?", (then, then))


def _removed(url: str) -> int:
    import httpx

    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        if line.startswith('flowstate_retention_removed_total{kind="session"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _run(target: str, on: bool, sessions: int, turns: int, expired: int) -> dict[str, Any]:
    import httpx

    seed(target, expired)
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--retention", "idle=30d", "--retention-every", "1"] if on else []
        proc, url = serve(Path(tmp), [output(assistant_message={"content": "noted"})] * (sessions * turns), target,
                          args)
        try:
            ran = traffic(url, sessions, turns)
            during = _removed(url)
            deadline = time.monotonic() + 600
            while on and _removed(url) < expired and time.monotonic() < deadline:
                time.sleep(0.2)
            listed = httpx.get(url + "/v1/sessions", params={"limit": 100}, timeout=120).json()["data"]
            mine = [d for d in listed if d["id"].startswith(ran["prefix"])]
            after = _removed(url)
        finally:
            stop(proc)
    return {"retention": "idle=30d" if on else "off", **figures(ran), "removed_during": during if on else None,
            "removed_all": (after == expired and len(mine) == sessions) if on else None}


def bench_retention(targets: dict[str, Callable[[], str]], sessions: int, turns: int, expired: int,
                    progress: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    for label, make in targets.items():
        for on in (False, True):
            row = {"database": label, "expired": expired, "sessions": sessions, "turns": turns,
                   **_run(make(), on, sessions, turns, expired)}
            progress(f"{label}, retention {row['retention']}: p99 {row['p99_ms']} ms")
            rows.append(row)
    return rows


HEAD = ["database", "retention", "expired", "sessions", "turns", "p50_ms", "p99_ms", "max_ms", "health_p99_ms",
        "removed_during", "removed_all"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
