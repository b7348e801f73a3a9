"""Retention: how long memory is kept, and what a sweep removes once it has outlived that.

A policy bounds idle time (since a session last finished a request) and age (since it was made). The server's
policy (``--retention idle=30d,age=180d``) holds for every tenant that has none of its own; a tenant's own (the
``tenants.retention`` column) replaces it, and ``off`` keeps its memory until it is deleted. What expires:

- a session idle or old past the policy, with all it owns (``flowstate/store/forget.py``) — never one whose request
  waits on tool results, one a turn holds now, or one whose forks still share its requests (it goes after them);
- a stored response older than either bound (a response is never touched again after it ends, so its creation is
  its last activity), unless a background turn still runs it;
- a created conversation never used, by the same clock.

``due`` lists what has expired (a dry run is exactly this list); ``expire`` removes a batch of it in one write
transaction, checking each again there, so two servers sweeping one database remove each row once and never one
that came back to life meanwhile.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from flowstate.store import forget
from flowstate.store.audit import Entry, write
from flowstate.store.backends import Backend, Conn, PostgresBackend

log = logging.getLogger("flowstate.store")

DAY_S = 86_400
UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY_S, "w": 7 * DAY_S}
KINDS = ("session", "response", "conversation")
NEVER = -1  # a bound that is off: no stored time is below it
SWEEP_LOCK = 0x466C5254  # the advisory lock a sweeping server holds, so one server sweeps a shared database at a time
_CLOCK = "COALESCE(NULLIF(s.active_at, 0), s.created_at)"  # a session's last activity


class PolicyError(ValueError):
    pass


class _Planned(Exception):
    """A dry run's end: what it removed, then rolled back."""

    def __init__(self, removed: list[Expired]) -> None:
        super().__init__("dry run")
        self.removed = removed


MAX_DURATION_S = 36_500 * 86_400  # 100 years: any longer bound is "off", and what a database's integers hold


def duration(text: str) -> int:
    """Seconds of ``30d``, ``12h``, ``90m``, ``45s``, ``2w``; at most ``MAX_DURATION_S``."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if m is None or not m.group(1).strip("0"):
        raise PolicyError(f"invalid duration {text[:40]!r}: a positive whole number and a unit (s, m, h, d, w), "
                          "e.g. 30d")
    digits = m.group(1).lstrip("0")
    if len(digits) > 12 or int(digits) * UNITS[m.group(2)] > MAX_DURATION_S:  # never a huge int built
        raise PolicyError(f"invalid duration {text[:40]!r}: at most 36500d (100 years); for no bound, off")
    return int(digits) * UNITS[m.group(2)]


def _show(seconds: int) -> str:
    for unit in ("d", "h", "m"):
        if seconds % UNITS[unit] == 0:
            return f"{seconds // UNITS[unit]}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class RetentionPolicy:
    """How long memory is kept: removed once idle longer than ``idle_s`` or older than ``age_s`` (None: no bound)."""

    idle_s: int | None = None
    age_s: int | None = None

    def __bool__(self) -> bool:
        return self.idle_s is not None or self.age_s is not None

    def __str__(self) -> str:
        parts = [f"{k}={_show(v)}" for k, v in (("idle", self.idle_s), ("age", self.age_s)) if v is not None]
        return ",".join(parts) or "off"

    def cutoffs(self, now: float) -> tuple[int, int]:
        """The idle and age cutoffs at ``now``: a time below one has expired."""
        return (NEVER if self.idle_s is None else int(now) - self.idle_s,
                NEVER if self.age_s is None else int(now) - self.age_s)


def parse_policy(text: str) -> RetentionPolicy:
    """``idle=30d,age=180d``, either bound alone, or ``off``."""
    text = text.strip()
    if text == "off":
        return RetentionPolicy()
    found: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in ("idle", "age") or not value or name in found:
            raise PolicyError(f"invalid retention policy {text[:100]!r}: idle=DURATION and/or age=DURATION, "
                              "comma-separated (e.g. idle=30d,age=180d), or off")
        found[name] = duration(value)
    return RetentionPolicy(found.get("idle"), found.get("age"))


@dataclass(frozen=True)
class Expired:
    """Something past its policy: a session (its full name), a stored response (its id) or a conversation."""

    kind: str  # one of KINDS
    name: str
    tenant: str | None  # whose (None on an open server)
    why: str = field(default="", compare=False)  # which policy, and the time past it (its last activity, its age)
    responses: int = field(default=0, compare=False)  # a session's stored responses, which go with it


def _ago(seconds: float) -> str:
    """A time past, in the largest whole unit it holds (rounded down: 40 days and 3 hours is 40d)."""
    for unit in ("d", "h", "m"):
        if seconds >= UNITS[unit]:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{int(seconds)}s"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _why(rule: _Rule, now: float, active: float | None, created: float) -> str:
    """Why something went: the policy (the tenant's or the server's) and each bound it is past."""
    policy, whose = rule.policy, "the tenant's" if rule.prefix else "the server's"
    past = []
    if policy.idle_s is not None and active is not None and active < now - policy.idle_s:
        past.append(f"idle {_ago(now - active)} (last active {_when(active)}) > idle={_show(policy.idle_s)}")
    if policy.age_s is not None and created < now - policy.age_s:
        past.append(f"{_ago(now - created)} old (created {_when(created)}) > age={_show(policy.age_s)}")
    if not past:  # a response or conversation: past the longer of the two bounds since it was made
        bound = max(b for b in (policy.idle_s, policy.age_s) if b is not None)
        past.append(f"{_ago(now - created)} old (created {_when(created)}) > {_show(bound)}")
    return f"{whose} policy {policy}: " + "; ".join(past)


@dataclass(frozen=True)
class _Rule:
    """One policy over one namespace (``prefix``), or the server's over every namespace but ``others``."""

    prefix: str
    policy: RetentionPolicy
    others: tuple[str, ...] = ()

    def where(self, column: str) -> tuple[str, list[object]]:
        sql, args = [f"substr({column}, 1, ?) = ?"], [len(self.prefix), self.prefix]
        for other in self.others:
            sql.append(f"substr({column}, 1, ?) <> ?")
            args += [len(other), other]
        return " AND ".join(sql), args


def _tenant_of(name: str) -> str | None:
    return name[:name.index("/")] if "/" in name else None


class RetentionStore:
    """The tenants' policies, and the expired rows of one database."""

    def __init__(self, backend: Backend) -> None:
        self._db = backend
        self._shared = isinstance(backend, PostgresBackend)
        self.unreadable: set[str] = set()  # tenants whose stored policy no sweep could read (their memory is kept)

    def policies(self) -> dict[str, RetentionPolicy | None]:
        """Every tenant's own policy (None: the server's), in one query; one stored that cannot be read is what the
        sweep makes of it, nothing expires (``_rules``)."""
        out: dict[str, RetentionPolicy | None] = {}
        with self._db.read() as conn:
            for tenant, text in conn.execute("SELECT id, retention FROM tenants"):
                try:
                    out[tenant] = None if text is None else parse_policy(text)
                except PolicyError:
                    out[tenant] = RetentionPolicy()
        return out

    def policy(self, tenant: str) -> RetentionPolicy | None:
        """The tenant's own policy (None: the server's)."""
        with self._db.read() as conn:
            row = conn.execute("SELECT retention FROM tenants WHERE id = ?", (tenant,)).fetchone()
        return None if row is None or row[0] is None else parse_policy(row[0])

    def set_policy(self, tenant: str, policy: RetentionPolicy | None, audit: Entry | None = None) -> bool:
        """Give the tenant its own policy, or (None) the server's; False if there is no such tenant."""
        with self._db.write(f"cannot change the retention of tenant {tenant!r}") as conn:
            row = conn.execute("UPDATE tenants SET retention = ? WHERE id = ? RETURNING id",
                               (None if policy is None else str(policy), tenant)).fetchone()
            if row is not None and audit is not None:
                write(conn, audit)
        return row is not None

    def _rules(self, conn: Conn, default: RetentionPolicy) -> list[_Rule]:
        """Each tenant's own policy, then the server's over the rest. A stored policy that does not parse (written
        before its bounds were checked) is passed over — that tenant's memory is kept, never swept by another
        policy — and counted in ``unreadable``: one tenant's row never stops the sweep for all."""
        own: list[tuple[str, RetentionPolicy]] = []
        for tenant, text in conn.execute("SELECT id, retention FROM tenants WHERE retention IS NOT NULL ORDER BY id"):
            try:
                own.append((tenant + "/", parse_policy(text)))
            except PolicyError as exc:
                own.append((tenant + "/", RetentionPolicy()))  # kept from every rule, the server's included
                if tenant not in self.unreadable:
                    log.warning("retention: tenant %s's policy cannot be read, its memory is kept: %s", tenant, exc)
                self.unreadable.add(tenant)
        rules = [_Rule(prefix, policy) for prefix, policy in own if policy]
        if default:
            rules.append(_Rule("", default, tuple(prefix for prefix, _ in own)))
        return rules

    def due(self, default: RetentionPolicy, now: float, limit: int = 100) -> list[Expired]:
        """Up to ``limit`` expired things at ``now``: sessions first (forks before the sessions they were forked
        from), then responses, then unused conversations."""
        with self._db.read() as conn:
            return self._due(conn, default, now, limit)

    def _due(self, conn: Conn, default: RetentionPolicy, now: float, limit: int) -> list[Expired]:
        out: list[Expired] = []
        for rule in self._rules(conn, default):
            idle, age = rule.policy.cutoffs(now)
            where, args = rule.where("s.name")
            rows = conn.execute(
                f"SELECT s.name, {_CLOCK}, s.created_at, (SELECT count(*) FROM responses r WHERE r.session = s.name)"
                f" FROM sessions s WHERE {where} AND ({_CLOCK} < ? OR s.created_at < ?)"
                " AND NOT EXISTS (SELECT 1 FROM pending_requests p WHERE p.name = s.name)"
                " AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_id = s.id) ORDER BY s.id DESC LIMIT ?",
                (*args, idle, age, limit)).fetchall()
            out += [Expired("session", r[0], _tenant_of(r[0]), _why(rule, now, r[1], r[2]), r[3]) for r in rows]
            cutoff = max(idle, age)
            where, args = rule.where("namespace")
            rows = conn.execute(f"SELECT id, namespace, created_at FROM responses WHERE {where} AND lease_at IS NULL"
                                " AND created_at < ? ORDER BY created_at, id LIMIT ?",
                                (*args, cutoff, limit)).fetchall()
            out += [Expired("response", r[0], r[1][:-1] or None, _why(rule, now, None, r[2])) for r in rows]
            where, args = rule.where("c.session")
            rows = conn.execute(f"SELECT c.session, c.created_at FROM conversations c WHERE {where}"
                                " AND c.created_at < ? AND NOT EXISTS"
                                " (SELECT 1 FROM sessions s WHERE s.name = c.session)"
                                " AND NOT EXISTS (SELECT 1 FROM pending_requests p WHERE p.name = c.session)"
                                " ORDER BY c.created_at, c.session LIMIT ?", (*args, cutoff, limit)).fetchall()
            out += [Expired("conversation", r[0], _tenant_of(r[0]), _why(rule, now, None, r[1])) for r in rows]
        order = {kind: i for i, kind in enumerate(KINDS)}
        return sorted(out, key=lambda e: order[e.kind])[:limit]

    def expire(self, items: Sequence[Expired], default: RetentionPolicy, now: float,
               actor: str = "server") -> list[Expired]:
        """Remove ``items`` that are still expired, in one transaction (a session a turn holds, or that came back
        to life, stays); each removed session recorded in the audit trail (``session.expire``). What was removed."""
        with self._db.write("cannot remove expired memory") as conn:
            return self._expire(conn, items, default, now, actor)

    def _expire(self, conn: Conn, items: Sequence[Expired], default: RetentionPolicy, now: float,
                actor: str) -> list[Expired]:
        removed: list[Expired] = []
        policies = {r.prefix: r.policy for r in self._rules(conn, default)}
        for item in items:
            policy = policies.get(f"{item.tenant}/" if item.tenant else "", default)
            if self._drop(conn, item, policy, now):
                removed.append(item)
                if item.kind == "session":
                    write(conn, Entry("session.expire", item.name[len(item.tenant or "") + bool(item.tenant):],
                                      actor, tenant=item.tenant, detail={"policy": str(policy)}))
        return removed

    def _drop(self, conn: Conn, item: Expired, policy: RetentionPolicy, now: float) -> bool:
        if not policy:
            return False
        idle, age = policy.cutoffs(now)
        if item.kind == "response":
            return conn.execute("DELETE FROM responses WHERE id = ? AND lease_at IS NULL AND created_at < ?"
                                " RETURNING id", (item.name, max(idle, age))).fetchone() is not None
        if item.kind == "conversation":
            return conn.execute("DELETE FROM conversations WHERE session = ? AND created_at < ? AND NOT EXISTS"
                                " (SELECT 1 FROM sessions WHERE name = ?) RETURNING session",
                                (item.name, max(idle, age), item.name)).fetchone() is not None
        if forget.turn_holds(conn, item.name, self._shared):
            return False
        still = conn.execute(f"SELECT 1 FROM sessions s WHERE s.name = ? AND ({_CLOCK} < ? OR s.created_at < ?)"
                             " AND NOT EXISTS (SELECT 1 FROM pending_requests p WHERE p.name = s.name)"
                             " AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_id = s.id)",
                             (item.name, idle, age)).fetchone()
        return still is not None and forget.delete_session(conn, item.name, self._shared)

    def sweep(self, default: RetentionPolicy, now: float, batch: int = 20, keep: Iterable[str] = (),
              actor: str = "shell", dry_run: bool = False) -> list[Expired]:
        """Remove everything expired at ``now``, ``batch`` at a time (a transaction each), but the sessions in
        ``keep``; what was removed. ``dry_run``: the same sweep in one transaction, rolled back — what it would
        remove now, exactly. For a shell or a test: a server sweeps through ``serving.retention``."""
        if dry_run:
            try:
                with self._db.write("cannot list expired memory") as conn:
                    raise _Planned(self._batches(lambda n: self._due(conn, default, now, n),
                                                 lambda items: self._expire(conn, items, default, now, actor),
                                                 batch, keep))
            except _Planned as planned:
                return planned.removed
        return self._batches(lambda n: self.due(default, now, n),
                             lambda items: self.expire(items, default, now, actor), batch, keep)

    @staticmethod
    def _batches(due: Callable[[int], list[Expired]], expire: Callable[[list[Expired]], list[Expired]], batch: int,
                 keep: Iterable[str]) -> list[Expired]:
        kept, removed = set(keep), list[Expired]()
        while True:
            items = [e for e in due(batch + len(kept)) if e.name not in kept][:batch]
            if not items:
                return removed
            done = expire(items)
            removed += done
            kept.update(e.name for e in items if e not in done)  # held or revived: not asked again this sweep

    def try_sweeping(self) -> AbstractContextManager[bool]:
        """A context manager whose value says whether this process may sweep now: on PostgreSQL, it holds the
        sweep's advisory lock (one server at a time); on SQLite, always."""
        if not self._shared:
            return nullcontext(True)
        backend: PostgresBackend = self._db  # type: ignore[assignment]
        return backend.try_lock(SWEEP_LOCK)

