"""The audit trail: an append-only record of every admin action (a tenant made, its quota changed; a key made,
rotated, revoked) and every data action (a session exported, imported, deleted or expired, memory searched, a subject
erased), with when, which
tenant, which key (its id, never its secret), what, on what, and how it ended. A change is recorded in the
transaction that makes it (``write``: both or neither); a refused or failed action, and a read (an export, a search),
in a transaction of its own before its answer leaves. It stays with the server: no session file carries it. Each entry
is linked into a hash chain as it is written (flowstate/store/chain.py), so a rewrite past the triggers shows."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from flowstate.store import chain
from flowstate.store.backends import Backend, Conn


def text_digest(text: str) -> str:
    """What the trail keeps of a text a caller sent (a search's query): never the text — it may be a secret, or
    what an erasure must remove — but ``sha256:`` and 16 hex digits of its digest, which tells equal queries apart."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def new_id(prefix: str) -> str:
    """An id that sorts in the order ids were made (nanoseconds, fixed width), then 32 random bits."""
    return f"{prefix}{time.time_ns():016x}{secrets.token_hex(4)}"


ACTORS = ("admin", "tenant", "shell", "server")
ACTIONS = ("tenant.create", "tenant.quota", "key.create", "key.rotate", "key.revoke", "session.export",
           "session.import", "session.delete", "memory.search", "session.read",  # session.read: by an admin key
           "session.expire", "tenant.retention",  # session.expire: by retention's sweep
           "subject.erase",  # its target: the subject's salted digest (sha256: and 16 hex digits)
           "request.feedback")  # its target: SESSION#N; its detail the score and label, never the comment
MAX_PAGE = 1000


@dataclass(frozen=True)
class Entry:
    action: str  # one of ACTIONS
    target: str  # what it acted on: a tenant, key or session id, or the digest of a search's query (text_digest)
    actor: str  # "admin" (an admin key), "tenant" (a tenant's key), "shell" (flowstate … --db) or "server" (a sweep)
    key: str | None = None  # the key's id (an admin key: "admin:" + the first 12 hex digits of its digest)
    tenant: str | None = None  # whose data or settings
    result: str = "ok"  # "ok", "refused" or "failed"
    detail: Mapping[str, Any] = field(default_factory=dict)  # why it was refused, what it moved
    id: str = ""
    at: float = 0.0

    def refused(self, why: str) -> Entry:
        return Entry(self.action, self.target, self.actor, self.key, self.tenant, "refused", {"reason": why})


def write(conn: Conn, entry: Entry) -> Entry:
    """Append ``entry`` in the caller's transaction (it commits or rolls back with the action)."""
    if entry.action not in ACTIONS:
        raise ValueError(f"unknown audit action {entry.action!r}")
    stored = Entry(**{**asdict(entry), "id": new_id("aud_"), "at": time.time()})
    row = (stored.id, stored.at, stored.tenant, stored.key, stored.actor, stored.action, stored.target[:500],
           stored.result, json.dumps(dict(stored.detail), sort_keys=True))
    conn.execute("INSERT INTO audit (id, at, tenant, key_id, actor, action, target, result, detail) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    chain.append(conn, row)
    return stored


class AuditLog:
    def __init__(self, backend: Backend) -> None:
        self._db = backend

    def record(self, entry: Entry) -> Entry:
        """Append ``entry`` in a transaction of its own."""
        with self._db.write(f"cannot record {entry.action} in the audit trail") as conn:
            return write(conn, entry)

    def verify(self, expect: str | None = None) -> chain.ChainVerdict:
        """The hash chain walked under ``$FLOWSTATE_AUDIT_KEY`` (and ``expect``, a head recorded earlier)."""
        return chain.verify(self._db, chain.key(), expect)

    def entries(self, since: float | None = None, tenant: str | None = None, action: str | None = None,
                limit: int = 100, after: str | None = None, *, actor: str | None = None,
                until: float | None = None) -> tuple[list[Entry], bool]:
        """A page of entries, oldest first, from ``since`` until before ``until`` (unix seconds), of one ``tenant``,
        ``action`` or ``actor``, after the entry ``after``; and whether more follow."""
        where, args = ["1 = 1"], []
        for clause, value in (("at >= ?", since), ("at < ?", until), ("tenant = ?", tenant), ("action = ?", action),
                              ("actor = ?", actor), ("id > ?", after)):
            if value is not None:
                where.append(clause)
                args.append(value)
        with self._db.read() as conn:
            rows = conn.execute("SELECT id, at, tenant, key_id, actor, action, target, result, detail FROM audit "
                                f"WHERE {' AND '.join(where)} ORDER BY id LIMIT ?", (*args, limit + 1)).fetchall()
        found = [Entry(action=r[5], target=r[6], actor=r[4], key=r[3], tenant=r[2], result=r[7],
                       detail=json.loads(r[8]), id=r[0], at=r[1]) for r in rows[:limit]]
        return found, len(rows) > limit
