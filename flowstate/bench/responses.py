"""``flowstate bench responses``: a chain of N stored responses (each continuing the one before by
``previous_response_id``) through the official ``openai`` client, then ``GET /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items`` on random responses of the chain, and forks: new responses that continue
random earlier responses of the chain (each a new session sharing that response's requests, nothing copied): latency
p50/p99 per database, a fork's create beside the chain's.

The engine is the scripted one (no model time): what is measured is the endpoint and its storage. Latency is the
client's, over loopback, one call at a time.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowstate.bench.server import output, serve, stop
from flowstate.bench.table import table
from flowstate.eval.metrics import percentile


def _ms(values: Sequence[float]) -> tuple[float, float]:
    return round(1000 * statistics.median(values), 2), round(1000 * percentile(values, 99), 2)


def measure(db: str, label: str, chain: int, reads: int, forks: int,
            progress: Callable[[str], None]) -> dict[str, Any]:
    from openai import OpenAI

    with tempfile.TemporaryDirectory() as tmp:
        outputs = [output(assistant_message={"content": f"noted {i}"}) for i in range(chain + forks)]
        proc, url = serve(Path(tmp), outputs, db or str(Path(tmp) / "responses.db"))
        try:
            client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
            ids: list[str] = []
            created: list[float] = []
            for i in range(chain):
                started = time.perf_counter()
                r = client.responses.create(model="flowstate", input=f"note {i}",
                                            previous_response_id=ids[-1] if ids else None)
                created.append(time.perf_counter() - started)
                ids.append(r.id)
            progress(f"{label}: a chain of {chain} responses stored")
            picks = random.Random(7).choices(ids, k=reads)
            gets, lists = [], []
            for rid in picks:
                started = time.perf_counter()
                assert client.responses.retrieve(rid).id == rid
                gets.append(time.perf_counter() - started)
                started = time.perf_counter()
                assert client.responses.input_items.list(rid).data[0].type == "message"
                lists.append(time.perf_counter() - started)
            forked = _forks(client, ids[:-1], forks)
        finally:
            stop(proc)
    (create_p50, create_p99), (get_p50, get_p99), (items_p50, items_p99) = _ms(created), _ms(gets), _ms(lists)
    fork_p50, fork_p99 = _ms(forked) if forked else (None, None)
    return {"database": label, "chain": chain, "reads": reads, "create_p50_ms": create_p50,
            "create_p99_ms": create_p99, "get_p50_ms": get_p50, "get_p99_ms": get_p99,
            "input_items_p50_ms": items_p50, "input_items_p99_ms": items_p99, "forks": len(forked),
            "fork_p50_ms": fork_p50, "fork_p99_ms": fork_p99}


def _forks(client: Any, earlier: list[str], n: int) -> list[float]:
    """Create times of ``n`` forks, each continuing a random earlier response of the chain: the fork's request is
    numbered after the ones it shares (the bench checks it), in a session of its own."""
    times = []
    for at in random.Random(11).choices(range(len(earlier)), k=n if earlier else 0):
        started = time.perf_counter()
        r = client.responses.create(model="flowstate", input=f"fork at {at + 1}", previous_response_id=earlier[at])
        times.append(time.perf_counter() - started)
        detail = r.model_extra["flowstate"]
        assert detail["request"] == at + 2 and detail["session"].startswith("fork_"), detail
    return times


def bench_responses(chain: int, reads: int, databases: Sequence[tuple[str, str]],
                 progress: Callable[[str], None], forks: int = 0) -> list[dict[str, Any]]:
    """Each database in turn; ``databases``: (label, postgresql:// URL, or "" for a fresh SQLite file)."""
    return [measure(db, label, chain, reads, forks, progress) for label, db in databases]


HEAD = ["database", "chain", "reads", "create_p50_ms", "create_p99_ms", "get_p50_ms", "get_p99_ms",
        "input_items_p50_ms", "input_items_p99_ms", "forks", "fork_p50_ms", "fork_p99_ms"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
