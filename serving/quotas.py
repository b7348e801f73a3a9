"""Admission against a tenant's quota, before anything of a request is stored: a 429 in OpenAI's shape (with
``Retry-After`` and the ``x-ratelimit-*`` headers; a spent daily budget says ``insufficient_quota`` and tells the
client not to retry), or a slot the turn holds until it ends, when the model tokens it spent are counted. The counts
live in the database (``flowstate/store/quotas.py``); this server renews the leases of the turns it runs."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from flowstate.store.quotas import QuotaStore, QuotaVerdict
from serving.errors import APIError


def _duration(seconds: float) -> str:
    """A Go-style duration, as OpenAI's ``x-ratelimit-reset-*`` headers write it (``1s``, ``6m0s``)."""
    s = max(0, math.ceil(seconds))
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + f"{secs}s"


def headers(verdict: QuotaVerdict, now: float) -> dict[str, str]:
    """OpenAI's rate-limit headers for the limits the tenant has."""
    q, u = verdict.quota, verdict.usage
    out: dict[str, str] = {}
    if q.requests_per_minute is not None:
        out |= {"x-ratelimit-limit-requests": str(q.requests_per_minute),
                "x-ratelimit-remaining-requests": str(max(q.requests_per_minute - u.requests, 0)),
                "x-ratelimit-reset-requests": _duration(u.minute_ends - now)}
    if q.tokens_per_day is not None:
        out |= {"x-ratelimit-limit-tokens": str(q.tokens_per_day),
                "x-ratelimit-remaining-tokens": str(max(q.tokens_per_day - u.tokens, 0)),
                "x-ratelimit-reset-tokens": _duration(u.day_ends - now)}
    return out


def refusal(verdict: QuotaVerdict) -> APIError:
    now = time.time()
    q, u = verdict.quota, verdict.usage
    retry = {"Retry-After": str(max(1, math.ceil(verdict.retry_after_s)))}
    if verdict.refused == "tokens":
        return APIError(429, f"You exceeded your current quota: {u.tokens:,} of {q.tokens_per_day:,} model tokens "
                             f"today; it renews in {_duration(u.day_ends - now)} (UTC midnight)",
                        type="insufficient_quota", code="insufficient_quota",
                        headers={**headers(verdict, now), **retry, "x-should-retry": "false"})
    if verdict.refused == "requests":
        message = (f"Rate limit reached on requests per minute: limit {q.requests_per_minute}, used {u.requests}. "
                   f"Please try again in {_duration(verdict.retry_after_s)}.")
    else:
        message = (f"Rate limit reached on concurrent turns: limit {q.concurrent_turns}, running {u.turns}. "
                   "Please try again when one ends.")
    return APIError(429, message, type="requests", code="rate_limit_exceeded",
                    headers={**headers(verdict, now), **retry})


@dataclass
class Admitted:
    """A request let in: its tenant and turn slot (None: not counted, as on a server without tenants)."""

    admissions: Admissions
    tenant: str | None
    turn: str | None
    minute: int | None = None  # the minute its request was counted in (None: not counted)
    ended: bool = field(default=False)

    async def end(self, tokens: int, refund: bool = False) -> None:
        """Free the slot and count the tokens (once; later calls do nothing); ``refund``: the request is not
        counted in its minute after all (a turn that failed through the server's protocol, not the client's doing)."""
        if self.ended or self.tenant is None:
            return
        self.ended = True
        if self.turn is not None:
            self.admissions.running.pop(self.turn, None)
        minute = self.minute if refund else None
        await anyio.to_thread.run_sync(self.admissions.store.end, self.turn, self.tenant, tokens, minute)


class Admissions:
    """This server's admissions: every request of a tenant passes ``admit``; the slots of its running turns are
    renewed every ``store.lease_s / 3`` seconds."""

    def __init__(self, store: QuotaStore, on_refused: Callable[[str, str], None] = lambda ns, limit: None) -> None:
        self.store = store
        self.on_refused = on_refused  # (namespace, limit): the metrics count it
        self.running: dict[str, str] = {}  # turn slot -> tenant
        self._renewing: asyncio.Task[None] | None = None

    async def admit(self, namespace: str) -> Admitted:
        """A tenant's request against its quota: admitted, or a 429 before anything is stored."""
        tenant = namespace[:-1] if namespace.endswith("/") else None
        if tenant is None:  # a server without tenants: nothing to count
            return Admitted(self, None, None)
        verdict = await anyio.to_thread.run_sync(self.store.admit, tenant)
        if verdict.refused is not None:
            self.on_refused(namespace, verdict.refused)
            raise refusal(verdict)
        if verdict.turn is not None:
            self.running[verdict.turn] = tenant
            self._keep_renewing()
        counted = None if verdict.turn is None else int(verdict.usage.minute_ends // 60) - 1
        return Admitted(self, tenant, verdict.turn, counted)

    def _keep_renewing(self) -> None:
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        while self.running:
            await asyncio.sleep(self.store.lease_s / 3)
            try:
                await anyio.to_thread.run_sync(self.store.renew, list(self.running))
            except Exception:  # a storage fault now: the next round tries again, well inside the lease
                continue
