"""Tenants' quotas, counted in the database every server shares, so that two servers never admit twice a limit:
requests per minute (a row per tenant and minute), concurrent turns (a row per running turn, with a lease its server
renews: a killed server's turns stop counting when their lease runs out) and model tokens per day (a row per tenant
and UTC day); and each tenant's use over time, an hour a row, for the operator (``history``). Admission is one write
transaction, serialized per tenant (PostgreSQL: the tenant's row locked;
SQLite: its one writer), and decided before anything of the request is stored."""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass

from flowstate.store.audit import Entry, write
from flowstate.store.backends import Backend, Conn, PostgresBackend

DAY_S = 86_400
HOUR_S = 3600
MAX_BUCKETS = 1000  # hours or days in one read of the history


@dataclass(frozen=True)
class Quota:
    """A tenant's limits (None: none of that kind)."""

    requests_per_minute: int | None = None
    concurrent_turns: int | None = None
    tokens_per_day: int | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.requests_per_minute, self.concurrent_turns, self.tokens_per_day))


@dataclass(frozen=True)
class TenantUsage:
    """Where a tenant stands now: this minute's requests, running turns, today's tokens."""

    requests: int
    turns: int
    tokens: int
    minute_ends: float  # unix seconds
    day_ends: float


@dataclass(frozen=True)
class QuotaVerdict:
    """Admission: a turn's slot id (None if refused or unlimited), or which limit refused it and when to retry."""

    quota: Quota
    usage: TenantUsage  # as it stands after this admission
    turn: str | None = None
    refused: str | None = None  # "requests", "turns" or "tokens"
    retry_after_s: float = 0.0


def _refused(quota: Quota, usage: TenantUsage, now: float) -> QuotaVerdict | None:
    """Which limit refuses one more request now, if one does."""
    if quota.tokens_per_day is not None and usage.tokens >= quota.tokens_per_day:
        return QuotaVerdict(quota, usage, refused="tokens", retry_after_s=usage.day_ends - now)
    if quota.requests_per_minute is not None and usage.requests >= quota.requests_per_minute:
        return QuotaVerdict(quota, usage, refused="requests", retry_after_s=usage.minute_ends - now)
    if quota.concurrent_turns is not None and usage.turns >= quota.concurrent_turns:
        return QuotaVerdict(quota, usage, refused="turns", retry_after_s=1.0)
    return None


def _hour(conn: Conn, tenant: str, now: float, requests: int = 0, tokens: int = 0, refused: int = 0) -> None:
    """Add to the tenant's use in this hour (``usage_hours``)."""
    conn.execute("INSERT INTO usage_hours (tenant_id, hour, requests, tokens, refused) VALUES (?, ?, ?, ?, ?) "
                 "ON CONFLICT (tenant_id, hour) DO UPDATE SET requests = usage_hours.requests + ?, "
                 "tokens = usage_hours.tokens + ?, refused = usage_hours.refused + ?",
                 (tenant, int(now // HOUR_S), requests, tokens, refused, requests, tokens, refused))


@dataclass(frozen=True)
class UsageBucket:
    """A tenant's use in one hour or day: ``start`` in unix seconds."""

    start: int
    requests: int
    tokens: int
    refused: int


class QuotaStore:
    def __init__(self, backend: Backend, lease_s: float = 30.0) -> None:
        self._db = backend
        self.lease_s = lease_s
        self._pg = isinstance(backend, PostgresBackend)

    def quota(self, tenant: str) -> Quota:
        with self._db.read() as conn:
            row = conn.execute("SELECT requests_per_minute, concurrent_turns, tokens_per_day FROM tenants WHERE id = ?",
                               (tenant,)).fetchone()
        return Quota() if row is None else Quota(*row)

    def set_quota(self, tenant: str, quota: Quota, audit: Entry | None = None) -> bool:
        """Change a tenant's limits (``audit`` recorded in the same transaction); False if there is no such tenant."""
        with self._db.write(f"cannot change the quota of tenant {tenant!r}") as conn:
            row = conn.execute("UPDATE tenants SET requests_per_minute = ?, concurrent_turns = ?, tokens_per_day = ? "
                               "WHERE id = ? RETURNING id", (quota.requests_per_minute, quota.concurrent_turns,
                                                           quota.tokens_per_day, tenant)).fetchone()
            if row is not None and audit is not None:
                write(conn, audit)
        return row is not None

    def _usage(self, conn: Conn, tenant: str, now: float) -> TenantUsage:
        minute, day = int(now // 60), int(now // DAY_S)
        conn.execute("DELETE FROM quota_turns WHERE tenant_id = ? AND lease_at < ?", (tenant, now - self.lease_s))
        requests = conn.execute("SELECT requests FROM quota_minutes WHERE tenant_id = ? AND minute = ?",
                                (tenant, minute)).fetchone()
        turns = conn.execute("SELECT COUNT(*) FROM quota_turns WHERE tenant_id = ?", (tenant,)).fetchone()
        tokens = conn.execute("SELECT tokens FROM quota_days WHERE tenant_id = ? AND day = ?", (tenant, day)).fetchone()
        return TenantUsage(requests[0] if requests else 0, turns[0], tokens[0] if tokens else 0, (minute + 1) * 60.0,
                     (day + 1) * float(DAY_S))

    def everyone(self) -> dict[str, tuple[Quota, TenantUsage]]:
        """Every tenant's quota and use now, in one read of four queries whatever the number of tenants (a lapsed
        turn is not counted; ``usage`` drops it)."""
        now = time.time()
        minute, day = int(now // 60), int(now // DAY_S)
        with self._db.read() as conn:
            quotas = {r[0]: Quota(*r[1:]) for r in conn.execute(
                "SELECT id, requests_per_minute, concurrent_turns, tokens_per_day FROM tenants")}
            requests = dict(conn.execute("SELECT tenant_id, requests FROM quota_minutes WHERE minute = ?", (minute,)))
            turns = dict(conn.execute("SELECT tenant_id, COUNT(*) FROM quota_turns WHERE lease_at >= ? "
                                      "GROUP BY tenant_id", (now - self.lease_s,)))
            tokens = dict(conn.execute("SELECT tenant_id, tokens FROM quota_days WHERE day = ?", (day,)))
        ends = (minute + 1) * 60.0, (day + 1) * float(DAY_S)
        return {t: (q, TenantUsage(int(requests.get(t, 0)), int(turns.get(t, 0)), int(tokens.get(t, 0)), *ends))
                for t, q in quotas.items()}

    def usage(self, tenant: str) -> TenantUsage:
        with self._db.write("cannot read a tenant's usage") as conn:  # it drops lapsed turns
            return self._usage(conn, tenant, time.time())

    def admit(self, tenant: str) -> QuotaVerdict:
        """Admit one request of ``tenant`` against its limits, counting it, or say which limit refuses it. A tenant
        without limits is admitted without a write."""
        quota = self.quota(tenant)
        now = time.time()
        if not quota:
            return QuotaVerdict(quota, TenantUsage(0, 0, 0, (now // 60 + 1) * 60, (now // DAY_S + 1) * DAY_S))
        with self._db.write(f"cannot admit a request of tenant {tenant!r}") as conn:
            if self._pg:  # one admission of a tenant at a time, across every server
                conn.execute("SELECT id FROM tenants WHERE id = ? FOR UPDATE", (tenant,))
            usage = self._usage(conn, tenant, now)
            refused = _refused(quota, usage, now)
            if refused is not None:
                _hour(conn, tenant, now, refused=1)
                return refused
            conn.execute("INSERT INTO quota_minutes (tenant_id, minute, requests) VALUES (?, ?, 1) "
                         "ON CONFLICT (tenant_id, minute) DO UPDATE SET requests = quota_minutes.requests + 1",
                         (tenant, int(now // 60)))
            conn.execute("DELETE FROM quota_minutes WHERE tenant_id = ? AND minute < ?", (tenant, int(now // 60) - 1))
            turn = "turn_" + secrets.token_hex(8)
            conn.execute("INSERT INTO quota_turns (id, tenant_id, lease_at) VALUES (?, ?, ?)", (turn, tenant, now))
        after = TenantUsage(usage.requests + 1, usage.turns + 1, usage.tokens, usage.minute_ends, usage.day_ends)
        return QuotaVerdict(quota, after, turn=turn)

    def renew(self, turns: list[str]) -> None:
        """Renew the leases of turns this server runs (called every few seconds while any runs)."""
        if turns:
            with self._db.write("cannot renew turn leases") as conn:
                conn.executemany("UPDATE quota_turns SET lease_at = ? WHERE id = ?", [(time.time(), t) for t in turns])

    def end(self, turn: str | None, tenant: str, tokens: int, refund_minute: int | None = None) -> None:
        """A turn ended: its slot (if it held one) is free, and the model tokens it spent count in its tenant's day;
        with ``refund_minute``, its request no longer counts in that minute."""
        now = time.time()
        day = int(now // DAY_S)
        with self._db.write("cannot end a turn's quota") as conn:
            _hour(conn, tenant, now, requests=1, tokens=tokens)
            if turn is not None:
                conn.execute("DELETE FROM quota_turns WHERE id = ?", (turn,))
            if refund_minute is not None:
                conn.execute("UPDATE quota_minutes SET requests = requests - 1 WHERE tenant_id = ? AND minute = ? "
                             "AND requests > 0", (tenant, refund_minute))
            if tokens:
                conn.execute("INSERT INTO quota_days (tenant_id, day, tokens) VALUES (?, ?, ?) ON CONFLICT "
                             "(tenant_id, day) DO UPDATE SET tokens = quota_days.tokens + ?",
                             (tenant, day, tokens, tokens))

    def history(self, tenant: str, since: float, until: float, bucket_s: int = HOUR_S) -> list[UsageBucket]:
        """The tenant's use from ``since`` to before ``until``, a bucket an hour or a day (``bucket_s`` 3600 or
        86400), every bucket of the range (none used: zeros), oldest first; at most ``MAX_BUCKETS``."""
        if bucket_s not in (HOUR_S, DAY_S):
            raise ValueError(f"a bucket is an hour or a day, not {bucket_s} s")
        if until <= since:
            raise ValueError("until is not after since")
        first, end = int(since // bucket_s), math.ceil(until / bucket_s)
        if not 0 < end - first <= MAX_BUCKETS:
            raise ValueError(f"{end - first} buckets: 1 to {MAX_BUCKETS}")
        per = bucket_s // HOUR_S
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT hour / {per}, SUM(requests), SUM(tokens), SUM(refused) FROM usage_hours WHERE tenant_id = ? "
                f"AND hour >= ? AND hour < ? GROUP BY hour / {per}", (tenant, first * per, end * per)).fetchall()
        found = {int(b): (int(r), int(t), int(x)) for b, r, t, x in rows}
        return [UsageBucket(b * bucket_s, *found.get(b, (0, 0, 0))) for b in range(first, end)]
