"""``flowstate bench search``: memory search at 10^4–10^5 states, on SQLite and PostgreSQL, side by side.

For each size N, a database of N states is persisted the way the loop persists (requests of ten states and two
tool results, 100 states a session, one transaction a request), so the search index is written as the endpoint
writes it. The states' words follow a Zipf law over a vocabulary of 5,000, so queries meet common words (tens of
thousands of matches to rank) and rare ones. Then ``queries`` searches, timed one by one from the repository's
call to its page of hits: one or two words, a quarter of them filtered by type and a tenth within one session —
p50, p99 and the mean number of hits a page.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from flowstate.bench.repo import _ms, by_size
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.store.repository import Repository
from flowstate.store.search import Search

STATES_A_REQUEST, REQUESTS_A_SESSION = 10, 10
_DOMAIN = ("hotel flight booking price cancellation fee refund lisbon porto madrid paris berlin transfer airport "
           "room night breakfast suite budget quiet window upgrade seat aisle baggage loyalty member gold silver "
           "invoice receipt payment card visa deadline meeting report draft review customer order shipping return "
           "warranty delivery address reservation itinerary train taxi museum restaurant dinner vegetarian "
           "allergy").split()
VOCABULARY = (*_DOMAIN, *(f"w{i}" for i in range(5000 - len(_DOMAIN))))
TYPES = list(StateType)


class _Words:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        weights = [1 / (rank + 1) ** 1.1 for rank in range(len(VOCABULARY))]
        total = sum(weights)
        self.cum = []
        acc = 0.0
        for w in weights:
            acc += w / total
            self.cum.append(acc)

    def take(self, n: int) -> list[str]:
        import bisect

        return [VOCABULARY[min(bisect.bisect(self.cum, self.rng.random()), len(VOCABULARY) - 1)] for _ in range(n)]


def request_nodes(k: int, words: _Words) -> list[Node]:
    out: list[Node] = []
    for o in range(2):
        out.append(Node(id=f"obs_r{k}_s{o + 1}_1", kind="observation", type=StateType.KNOWLEDGE,
                        summary=f"search({' '.join(words.take(2))})", request=k,
                        value={"tool": "search", "result": {"text": " ".join(words.take(40))}}))
    for i in range(STATES_A_REQUEST):
        refs = (Ref(rel=Relation.DERIVES, state_id=f"obs_r{k}_s{i % 2 + 1}_1"),)
        out.append(Node(id=f"s{k}_{i}", type=TYPES[(k + i) % len(TYPES)], summary=" ".join(words.take(8)),
                        value={"detail": " ".join(words.take(6)), "note": " ".join(words.take(4)), "n": i},
                        refs=refs, request=k))
    return out


def fill(repo: Repository, states: int, seed: int = 0) -> int:
    """Persist ``states`` states; the sessions made."""
    words = _Words(random.Random(seed))
    requests = states // STATES_A_REQUEST
    for r in range(requests):
        session, k = f"s{r // REQUESTS_A_SESSION}", r % REQUESTS_A_SESSION + 1
        repo.persist_request(session, k, " ".join(words.take(6)), "done", request_nodes(k, words), {"steps": []},
                             strategy="flowstate")
    return (requests + REQUESTS_A_SESSION - 1) // REQUESTS_A_SESSION


def queries(n: int, sessions: int, seed: int = 1) -> list[Search]:
    rng = random.Random(seed)
    words = _Words(rng)
    out = []
    for i in range(n):
        found = tuple(dict.fromkeys(words.take(1 + (i % 2))))
        types = (TYPES[i % len(TYPES)].value,) if i % 4 == 0 else ()
        session = f"s{rng.randrange(sessions)}" if i % 10 == 3 else None
        out.append(Search(found, types=types, session=session))
    return out


def measure(repo: Repository, states: int, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    sessions = fill(repo, states)
    persist_s = time.perf_counter() - t0
    latencies, hits = [], 0
    for search in queries(n, sessions):
        t = time.perf_counter()
        page, _ = repo.catalog.search("", search)
        latencies.append(time.perf_counter() - t)
        hits += len(page)
    return {"states": states, "persist_states_per_s": states / persist_s, "queries": n,
            "p50_ms": _ms(latencies, 50), "p99_ms": _ms(latencies, 99), "max_ms": _ms(latencies, 100),
            "hits_per_page": hits / n}


def bench_search(targets: dict[str, Callable[[], str]], sizes: Sequence[int], n: int = 500,
                 progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Search latency by size on each database (``flowstate.bench.repo.by_size``)."""
    return by_size(targets, sizes, lambda repo, size: measure(repo, size, n), "states",
                   lambda r: f"search p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms", progress)


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| states | backend | queries | search p50 ms | search p99 ms | max ms | hits a page | persist states/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['states']:,} | {r['backend']} | {r['queries']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['max_ms']:.2f} | {r['hits_per_page']:.1f} | {r['persist_states_per_s']:,.0f} |")
    return "\n".join(lines)
