"""``flowstate bench repo``: the repository at 10^4–10^6 nodes, on SQLite and PostgreSQL, side by side.

For each size N, one session of N nodes is persisted the way the loop persists: requests of ten
nodes (five tool results and five states, each state citing a result and following the previous
state), one transaction per request. Then:

- persist rate: nodes per second over all those transactions;
- disclose latency: what PSA's Disclose reads for one node (the node, its relations, the relations
  that point at it), for ``samples`` random nodes — p50 and p99;
- index build: the Historical State Index of the whole session, read and rendered (what the first
  step of a request pays).

Backends run in turn at each size, so machine noise falls on both alike.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowstate.errors import StorageError
from flowstate.history import session_index
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.store.backends import redact
from flowstate.store.repository import Repository

PER_REQUEST = 10


def request_nodes(k: int) -> list[Node]:
    """Request k's nodes: five tool results and five states citing them, each state following the last."""
    out: list[Node] = []
    for i in range(PER_REQUEST // 2):
        obs = f"obs_r{k}_s{i + 1}_1"
        out.append(Node(id=obs, kind="observation", type=StateType.KNOWLEDGE,
                        summary=f"search(city=\"c{k}\", page={i})", request=k,
                        value={"tool": "search", "arguments": {"city": f"c{k}", "page": i},
                               "result": {"hotels": [{"id": f"h{k}_{j}", "price": 100 + j} for j in range(5)]}}))
        refs = [Ref(rel=Relation.SUPPORTS, state_id=obs)]
        if i:
            refs.append(Ref(rel=Relation.FOLLOWS, state_id=f"s{k}_{i - 1}"))
        out.append(Node(id=f"s{k}_{i}", type=StateType.JUDGEMENT, summary=f"cheapest hotel in c{k}, page {i}",
                        value={"hotel": f"h{k}_0", "price": 100, "page": i}, refs=tuple(refs), request=k))
    return out


def _ms(xs: Sequence[float], p: float) -> float:
    ys = sorted(xs)
    return 1000 * ys[min(len(ys) - 1, int(round(p / 100 * (len(ys) - 1))))]


def measure(repo: Repository, session: str, nodes: int, samples: int, seed: int = 0) -> dict[str, Any]:
    requests = nodes // PER_REQUEST
    started = time.perf_counter()
    for k in range(1, requests + 1):
        repo.persist_request(session, k, f"query {k}", f"answer {k}", request_nodes(k), {"steps": []})
    persist_s = time.perf_counter() - started
    rng = random.Random(seed)
    view = repo.view(session)
    latencies = []
    for _ in range(samples):
        k, i = rng.randint(1, requests), rng.randrange(PER_REQUEST // 2)
        target = rng.choice([f"s{k}_{i}", f"obs_r{k}_s{i + 1}_1"])
        t0 = time.perf_counter()
        node, incoming = view.disclosure(target)
        latencies.append(time.perf_counter() - t0)
        assert node is not None and (incoming or target.startswith("s"))
    t0 = time.perf_counter()
    index = session_index(repo, session)
    text = index.render()
    index_s = time.perf_counter() - t0
    return {
        "nodes": requests * PER_REQUEST, "persist_nodes_per_s": requests * PER_REQUEST / persist_s,
        "disclose_p50_ms": _ms(latencies, 50), "disclose_p99_ms": _ms(latencies, 99),
        "disclose_mean_ms": 1000 * statistics.fmean(latencies), "index_build_s": index_s, "index_chars": len(text),
    }


def by_size(targets: dict[str, Callable[[], str]], sizes: Sequence[int],
            measure_one: Callable[[Repository, int], dict[str, Any]], what: str, said: Callable[[dict[str, Any]], str],
            progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per size and database, each measured on a fresh one: ``targets`` maps a backend label to a function
    giving a fresh, empty database (path or URL); ``said`` is the progress line of a row."""
    rows = []
    for n in sizes:
        for label, fresh in targets.items():
            progress(f"{label}: {n:,} {what} …")
            with Repository.open(fresh()) as repo:
                row = {"backend": label, **measure_one(repo, n)}
            rows.append(row)
            progress(f"{label}: {n:,} {what}: {said(row)}")
    return rows


def bench_repo(targets: dict[str, Callable[[], str]], sizes: Sequence[int], samples: int = 2000,
               progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Persist, disclose and index build by size on each database (``by_size``)."""
    return by_size(targets, sizes, lambda repo, n: measure(repo, "bench", n, samples), "nodes",
                   lambda r: f"{r['persist_nodes_per_s']:,.0f} nodes/s, disclose p99 {r['disclose_p99_ms']:.3f} ms, "
                             f"index {r['index_build_s']:.2f} s", progress)


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| nodes | backend | persist nodes/s | disclose p50 ms | disclose p99 ms | index build s | ×SQLite "
             "(persist, p99) |",
             "|---|---|---|---|---|---|---|"]
    base = {r["nodes"]: r for r in rows if r["backend"] == "sqlite"}
    for r in rows:
        b = base.get(r["nodes"])
        ratio = "" if b is None or r is b else \
            f"{b['persist_nodes_per_s'] / r['persist_nodes_per_s']:.2f}× slower, " \
            f"{r['disclose_p99_ms'] / b['disclose_p99_ms']:.2f}×"
        lines.append(f"| {r['nodes']:,} | {r['backend']} | {r['persist_nodes_per_s']:,.0f} | "
                     f"{r['disclose_p50_ms']:.3f} | {r['disclose_p99_ms']:.3f} | {r['index_build_s']:.2f} | {ratio} |")
    return "\n".join(lines)


class Databases:
    """Fresh, empty databases for the benchmark, one per size and backend: SQLite files in ``folder``, and
    databases created on the PostgreSQL server of ``pg_url`` (a database whose user may create databases) —
    dropped again by ``close``."""

    def __init__(self, folder: str | Path, pg_url: str | None = None) -> None:
        self.folder, self.pg_url = Path(folder), pg_url
        self.made: list[str] = []
        if pg_url:
            self.postgres()  # the server is checked (with a database of its own) before anything is measured

    def targets(self) -> dict[str, Callable[[], str]]:
        return {"sqlite": self.sqlite, **({"postgres": self.postgres} if self.pg_url else {})}

    def sqlite(self) -> str:
        self.made.append(str(self.folder / f"bench-{len(self.made)}.db"))
        return self.made[-1]

    def postgres(self) -> str:
        import psycopg

        assert self.pg_url is not None
        name = f"flowstate_bench_{uuid.uuid4().hex[:10]}"
        try:
            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
        except psycopg.Error as exc:
            reason = " ".join(str(exc).split())
            raise StorageError(f"cannot create a benchmark database on {redact(self.pg_url)}: {reason}") from exc
        self.made.append(f"{self.pg_url.rpartition('/')[0]}/{name}")
        return self.made[-1]

    def close(self) -> None:
        """Drop the PostgreSQL databases made (the SQLite files go with their folder)."""
        made = [url for url in self.made if url.startswith("postgres")]
        if self.pg_url and made:
            import psycopg

            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                for url in made:
                    conn.execute(f"DROP DATABASE IF EXISTS {url.rpartition('/')[2]} WITH (FORCE)")

