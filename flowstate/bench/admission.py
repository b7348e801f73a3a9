"""``flowstate bench admission``: what tenants cost a request before its turn runs — resolving its key and admitting
it against its tenant's quota — in process, on SQLite and PostgreSQL side by side with keys off.

Per database, ``requests`` requests of one tenant are timed one by one, each as the server does it: the bearer key
resolved by the serving layer (``Authenticator.caller``: a digest lookup off the event loop on a cache miss, the
cache otherwise), then, for a tenant with limits, ``QuotaStore.admit`` (one write transaction) and ``end`` (the slot
freed, its tokens counted). Rows: keys off (an open server), a key from the cache, a key looked up every time (the
cache emptied before each), and key + admission + end with a quota; p50, p99 and the mean, in milliseconds."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from flowstate.bench.repo import _ms
from flowstate.bench.table import table
from flowstate.store.quotas import Quota
from flowstate.store.repository import Repository


async def _timed(n: int, one: Callable[[], Awaitable[Any]],
                 after: Callable[[Any], Awaitable[Any]] | None = None) -> dict[str, float]:
    """``one`` timed ``n`` times; ``after`` (untimed) takes what each returned."""
    times = []
    for i in range(n + 1):
        started = time.perf_counter()
        got = await one()
        if i:  # the first warms up
            times.append(time.perf_counter() - started)
        if after is not None:
            await after(got)
    return {"p50_ms": _ms(times, 50), "p99_ms": _ms(times, 99), "mean_ms": 1000 * sum(times) / len(times)}


async def _measure(repo: Repository, requests: int) -> list[dict[str, Any]]:
    """Each step as the server runs it, on one event loop (the lookups and admissions in worker threads)."""
    from serving.quotas import Admissions, Admitted
    from serving.tenancy import Authenticator

    tenant = repo.tenants.create_tenant("bench")
    _, secret = repo.tenants.create_key(tenant.id)
    header = f"Bearer {secret}"
    open_server, keyed = Authenticator(repo.tenants), Authenticator(repo.tenants)
    open_server.open = True  # what a server without keys does
    admissions = Admissions(repo.quotas)
    repo.quotas.set_quota(tenant.id, Quota(requests_per_minute=10**6, concurrent_turns=10**4, tokens_per_day=10**12))

    async def uncached() -> None:
        keyed.forget()
        await keyed.caller(header)

    async def admitted() -> Admitted:
        caller = await keyed.caller(header)
        assert caller.namespace is not None
        return await admissions.admit(caller.namespace)

    async def ended(slot: Admitted) -> None:
        await slot.end(100)

    async def turn_ends() -> None:  # after the turn, off its critical path: the slot freed, tokens counted
        await ended(await admissions.admit(tenant.id + "/"))

    rows = []
    for what, one, after in (("keys off", lambda: open_server.caller(None), None),
                             ("key, cached", lambda: keyed.caller(header), None),
                             ("key, looked up", uncached, None),
                             ("key + quota admission (before the turn)", admitted, ended),
                             ("quota admission + end (both writes)", turn_ends, None)):
        rows.append({"step": what, **await _timed(requests, one, after)})
    return rows


def measure(target: str, requests: int) -> list[dict[str, Any]]:
    with Repository.open(target) as repo:
        return anyio.run(_measure, repo, requests)


def bench_admission(targets: dict[str, Callable[[], str]], requests: int,
                    progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    rows = []
    for label, fresh in targets.items():
        progress(f"{label}: {requests:,} requests a step …")
        rows += [{"database": label, **row} for row in measure(fresh(), requests)]
    return rows


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    return table(["database", "step", "p50 ms", "p99 ms", "mean ms"],
                 [{"database": r["database"], "step": r["step"], "p50 ms": f"{r['p50_ms']:.3f}",
                   "p99 ms": f"{r['p99_ms']:.3f}", "mean ms": f"{r['mean_ms']:.3f}"} for r in rows])
