"""The Persistent State Repository M_k: sessions, requests, nodes, relations, on SQLite or PostgreSQL.

A request is persisted in one transaction at its end, so a crash loses at most the unfinished
request and never leaves half of one. Nothing here changes or deletes a persisted node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowstate.errors import SessionNotFound, StorageError
from flowstate.nodes import Node, Ref, canonical_json
from flowstate.store import forget, parts, transfer
from flowstate.store import search as fts
from flowstate.store.audit import AuditLog, Entry
from flowstate.store.audit import write as write_audit
from flowstate.store.backends import Backend, Conn, PostgresBackend, open_backend
from flowstate.store.erasure import ErasureStore
from flowstate.store.feedback import FeedbackStore
from flowstate.store.quotas import QuotaStore
from flowstate.store.redaction import Redacted
from flowstate.store.responses import ResponseStore
from flowstate.store.retention import RetentionStore
from flowstate.store.tenants import TenantStore
from flowstate.store.vault import Redaction

# A session's lineage: the session itself (every request of it), then, for a fork, the session it was forked from up
# to the fork's point, and so on up (each ancestor only up to its child's point). Every read of a session's requests,
# nodes, relations and transcripts joins it, so a fork shares what came before its point without a copy of it.
_LINE = ("WITH RECURSIVE line(sid, parent, fork_at, upto) AS ("
         "SELECT id, parent_id, fork_at, 2147483647 FROM sessions WHERE name = ?"
         " UNION ALL SELECT s.id, s.parent_id, s.fork_at, l.fork_at FROM sessions s JOIN line l ON s.id = l.parent) ")
_IN_LINE = "JOIN line l ON n.session_id = l.sid AND n.request_idx <= l.upto"  # nodes n of the lineage


@dataclass(frozen=True)
class RequestRow:
    """A persisted request of a session: answered, or ended unfinished (``unfinished`` says why)."""

    index: int
    query: str
    response: str | None
    unfinished: str | None = None
    created_at: int | None = None  # unix seconds it was persisted (None for requests persisted before that was kept)
    strategy: str | None = None  # the memory method it ran under (likewise)


@dataclass(frozen=True)
class Transcript:
    """The endpoint's record of one request: its messages as the server saw and answered them, and its
    Idempotency-Keys (key -> offset of the reply within ``messages``)."""

    messages: list[dict[str, Any]]
    idempotency: dict[str, int]


@dataclass(frozen=True)
class SessionSummary:
    """A session as a list of sessions shows it: its size, when it was made and last finished a request, the memory
    method of its last request, and the session it was forked from (name, shared requests)."""

    name: str
    requests: int  # finished requests, a fork's shared ones included
    states: int  # the states it can read (a fork's shared ones included)
    created_at: int | None
    active_at: int  # 0 for a session that finished no request since activity was kept
    strategy: str | None
    forked_from: tuple[str, int] | None


@dataclass(frozen=True)
class SessionView:
    """Read access to one session's M: what PSA's Disclose and a memory method's ``start`` see (never the other
    sessions of the repository)."""

    _repo: Repository
    session: str

    def node(self, node_id: str) -> Node | None:
        return self._repo.node(self.session, node_id)

    def incoming(self, node_id: str) -> list[tuple[str, str]]:
        return self._repo.incoming(self.session, node_id)

    def disclosure(self, node_id: str) -> tuple[Node | None, list[tuple[str, str]]]:
        return self._repo.disclosure(self.session, node_id)

    def nodes(self) -> list[Node]:
        return self._repo.nodes(self.session)

    def requests(self) -> list[RequestRow]:
        return self._repo.requests(self.session)

    def request_count(self) -> int:
        return self._repo.request_count(self.session)


class Repository:
    """All sessions of one database (a SQLite file or a PostgreSQL server); each session is its own M."""

    def __init__(self, backend: Backend) -> None:
        self._db = backend
        self.tenants = TenantStore(backend)  # who owns memory and the keys that prove it (flowstate/store/tenants.py)
        self.quotas = QuotaStore(backend)  # what each tenant may use, counted where every server sees it
        self.audit = AuditLog(backend)  # every admin and data action, appended in the action's transaction
        self.retention = RetentionStore(backend)  # how long memory is kept, and what has outlived it
        self.erasure = ErasureStore(backend)  # everything about a subject removed, with a receipt
        self.feedback = FeedbackStore(backend)  # what users said of requests, per key
        self._redaction: Redaction | None = None
        self.path = backend.label  # what messages name: the file, or the URL without its password
        self.shared = isinstance(backend, PostgresBackend)  # several processes may use it at once
        # the Responses API's stored responses and background leases, redacted as everything else
        self.responses = ResponseStore(backend, self.shared, self._redacted, self._seal)

    @property
    def redaction(self) -> Redaction | None:
        """What the repository redacts before it stores anything (None: nothing; ``flowstate/store/vault.py``)."""
        return self._redaction

    @redaction.setter
    def redaction(self, redaction: Redaction | None) -> None:
        self._redaction = redaction
        self.erasure.aliases = (lambda ns, subject: redaction.value(ns, [subject])) if redaction else (lambda *_: [])

    def redact(self, vault_key: str, kinds: Sequence[str]) -> Redaction:
        """From now on redact ``kinds`` in everything stored, keeping the values in the vault under ``vault_key``."""
        self.redaction = Redaction(self._db, vault_key, kinds)
        return self.redaction

    def _redacted(self, session: str, value: Any) -> tuple[Any, Redacted | None]:
        """``value`` as stored (redacted, when the repository redacts), and what was replaced."""
        if self._redaction is None:
            return value, None
        found = Redacted()
        return self._redaction.value(session, value, found), found

    def _seal(self, conn: Conn, session: str, found: Redacted | None) -> None:
        """The values redaction replaced, into the vault, in the caller's transaction."""
        if self._redaction is not None and found is not None and found.values:
            self._redaction.vault.seal(conn, session, found.values)

    @classmethod
    def open(cls, target: str | Path, *, create: bool = True) -> Repository:
        """Open (and with ``create``, create) the database — a SQLite path or a ``postgresql://`` URL — and
        bring its schema up to date."""
        return cls(open_backend(target, create=create))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Repository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> Any:
        return self._db.read()

    def _write(self, what: str) -> Any:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        return self._db.write(what)

    def session_lock(self, session: str) -> Any:
        """A lock on one session that every process sharing the database respects (PostgreSQL); a no-op on
        SQLite, whose one serving process keeps its own per-session locks."""
        return self._db.session_lock(session)

    def view(self, session: str) -> SessionView:
        return SessionView(self, session)

    # -- sessions and requests -------------------------------------------------------------

    def _session_id(self, conn: Conn, session: str) -> int | None:
        row = conn.execute("SELECT id FROM sessions WHERE name = ?", (session,)).fetchone()
        return int(row[0]) if row else None

    def sessions(self, prefix: str = "") -> list[str]:
        """Session names in creation order; with ``prefix``, only those that start with it."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT name FROM sessions WHERE substr(name, 1, ?) = ? ORDER BY id", (len(prefix), prefix)
            )
            return [r[0] for r in rows]

    def delete_session(self, session: str, audit: Entry | None = None) -> bool:
        """Forget a whole session: its requests, nodes and relations, its stored responses and conversation, in one
        transaction (``audit`` recorded in it, if there was anything to delete). The only deletion of history there
        is; returns False when the session does not exist.
        """
        with self._write(f"cannot delete session {session!r}") as conn:
            deleted = forget.delete_session(conn, session, self.shared)
            if deleted and audit is not None:
                write_audit(conn, audit)
        return deleted

    def fork(self, session: str, at: int, name: str) -> None:
        """A new session ``name`` that shares ``session``'s first ``at`` requests — their nodes, relations and
        transcripts — without copying them, and goes on from there on its own (its next request is ``at + 1``).
        Forking a fork at or before its own point shares from the session that holds those requests. Forking again
        under the same name at the same point is a no-op (a retried call); any other existing name is refused."""
        with self._write(f"cannot fork session {session!r} at request {at}") as conn:
            row = conn.execute("SELECT id, parent_id, fork_at FROM sessions WHERE name = ?", (session,)).fetchone()
            if row is None:
                raise SessionNotFound(f"unknown session {session!r} in {self.path}")
            sid, parent, fork_at = int(row[0]), row[1], int(row[2])
            done = int(conn.execute(_LINE + "SELECT COALESCE(MAX(r.idx), 0) FROM requests r JOIN line l"
                                    " ON r.session_id = l.sid AND r.idx <= l.upto", (session,)).fetchone()[0])
            if not 0 <= at <= done:
                raise StorageError(f"cannot fork session {session!r} at request {at}: it has {done} finished requests")
            while parent is not None and at <= fork_at:  # those requests are the ancestor's: share them from there
                sid, (parent, fork_at) = int(parent), conn.execute(
                    "SELECT parent_id, fork_at FROM sessions WHERE id = ?", (parent,)).fetchone()
            source: int | None = sid if at > 0 else None  # forking at 0 shares nothing: a new session
            existing = conn.execute("SELECT parent_id, fork_at FROM sessions WHERE name = ?", (name,)).fetchone()
            if existing is not None:
                if (existing[0], int(existing[1])) != (source, at if source is not None else 0):
                    raise StorageError(f"cannot fork session {session!r} as {name!r}: that session exists")
                return
            now = int(time.time())
            conn.execute("INSERT INTO sessions (name, parent_id, fork_at, created_at, active_at) "
                         "VALUES (?, ?, ?, ?, ?)", (name, source, at if source is not None else 0, now, now))

    def drop_empty_fork(self, session: str) -> bool:
        """Forget a fork that holds nothing of its own — no request, no fork, no waiting request, no stored
        response: what is left when its first request failed — in one transaction (a request that went on under it
        meanwhile keeps it). Whether it was dropped."""
        with self._write(f"cannot drop fork {session!r}") as conn:
            sid = self._session_id(conn, session)
            if sid is None:
                return False
            held = conn.execute(
                "SELECT 1 FROM requests WHERE session_id = ? UNION ALL SELECT 1 FROM sessions WHERE parent_id = ?"
                " UNION ALL SELECT 1 FROM pending_requests WHERE name = ? UNION ALL SELECT 1 FROM responses"
                " WHERE session = ?", (sid, sid, session, session)).fetchone()
            if held is not None:
                return False
            conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        return True

    def version(self, session: str) -> tuple[int, ...] | None:
        """What changes whenever what ``session_dump`` shows of the session changes — its requests, nodes, forks and
        feedback (stored history is never rewritten, only added to or deleted whole) — read in one query of
        counts; None if there is no such session. A poll compares it instead of reading the whole session."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT s.id, (SELECT COUNT(*) FROM requests r WHERE r.session_id = s.id),"
                " (SELECT COUNT(*) FROM nodes n WHERE n.session_id = s.id),"
                " (SELECT COUNT(*) FROM sessions c WHERE c.parent_id = s.id),"
                " (SELECT COALESCE(SUM(c.id), 0) FROM sessions c WHERE c.parent_id = s.id),"
                " (SELECT COUNT(*) FROM feedback f WHERE f.session = s.name),"
                " (SELECT COALESCE(MAX(f.id), 0) FROM feedback f WHERE f.session = s.name)"
                " FROM sessions s WHERE s.name = ?", (session,)).fetchone()
        return None if row is None else tuple(int(v) for v in row)

    def forked_from(self, session: str) -> tuple[str, int] | None:
        """The session a fork shares its first requests with, and how many (None for a session that is no fork)."""
        with self._read() as conn:
            row = conn.execute("SELECT p.name, s.fork_at FROM sessions s JOIN sessions p ON p.id = s.parent_id"
                               " WHERE s.name = ?", (session,)).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def forks(self, session: str) -> list[tuple[str, int]]:
        """The sessions forked from this one, with the requests each shares, in creation order."""
        with self._read() as conn:
            return [(r[0], int(r[1])) for r in conn.execute(
                "SELECT c.name, c.fork_at FROM sessions c JOIN sessions p ON p.id = c.parent_id WHERE p.name = ?"
                " ORDER BY c.id", (session,))]

    def session_page(self, prefix: str, *, contains: str = "", limit: int = 100,
                     after: str | None = None) -> tuple[list[SessionSummary], bool]:
        """Sessions whose names start with ``prefix``, the most recently active first (then the newest), ``limit`` at
        a time from the one after the session named ``after``; with ``contains``, only names (past the prefix) that
        contain it, ignoring case. Whether more follow. An index seek a page, whatever the number of sessions."""
        where, args = "substr(s.name, 1, ?) = ?", [len(prefix), prefix]
        if contains:
            escaped = contains.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where += " AND lower(substr(s.name, ?)) LIKE ? ESCAPE '\\'"
            args += [len(prefix) + 1, f"%{escaped}%"]
        if after is not None:
            where += " AND (s.active_at, s.id) < (SELECT active_at, id FROM sessions WHERE name = ?)"
            args.append(after)
        sql = ("SELECT s.name, COALESCE((SELECT MAX(r.idx) FROM requests r WHERE r.session_id = s.id), s.fork_at),"
               " (SELECT COUNT(*) FROM nodes n WHERE n.session_id = s.id AND n.kind = 'state'), s.created_at,"
               " s.active_at, (SELECT r.strategy FROM requests r WHERE r.session_id = s.id ORDER BY r.idx DESC"
               " LIMIT 1), p.name, s.fork_at FROM sessions s LEFT JOIN sessions p ON p.id = s.parent_id"
               f" WHERE {where} ORDER BY s.active_at DESC, s.id DESC LIMIT ?")
        with self._read() as conn:
            rows = conn.execute(sql, [*args, limit + 1]).fetchall()
            out = []
            for name, requests, states, created, active, strategy, parent, at in rows[:limit]:
                if parent is not None:  # a fork reads its parent's states up to its point too
                    count = _LINE + "SELECT COUNT(*) FROM nodes n " + _IN_LINE + " WHERE n.kind = 'state'"
                    states = conn.execute(count, (name,)).fetchone()[0]
                out.append(SessionSummary(name, int(requests), int(states), None if created is None else int(created),
                                          int(active), strategy, None if parent is None else (parent, int(at))))
        return out, len(rows) > limit

    def search(self, namespace: str, search: fts.Search) -> tuple[list[fts.Hit], bool]:
        """One page of the states (and observations) of the namespace's sessions that match ``search``, best first,
        and whether more follow (``flowstate/store/search.py``)."""
        with self._read() as conn:
            return fts.run(conn, search, namespace, self.shared, _LINE)

    # -- a portable session file (flowstate/store/transfer.py) -----------------------------------

    def export_sessions(self, names: Sequence[str], namespace: str = "") -> list[str]:
        """The session file (its lines) of the sessions ``names`` (full names, in ``namespace``), read at one point."""
        from flowstate.store.migrations import MIGRATIONS

        with self._read() as conn:
            return list(transfer.export_lines(conn, names, namespace, MIGRATIONS[-1][0], _LINE))

    def import_sessions(self, lines: Iterable[str], namespace: str = "",
                        rename: Mapping[str, str] | None = None) -> list[str]:
        """Import a session file into ``namespace``, all or nothing; the names of the sessions made. A bad file is a
        ``BadSessionFile``, a taken name a ``SessionExists``, and then nothing is written."""
        file = transfer.read_file(lines, rename)
        self.write_sessions(file, namespace)
        return file.names

    def write_sessions(self, file: transfer.SessionFile, namespace: str = "", audit: Entry | None = None) -> None:
        """Write a checked session file's sessions into ``namespace`` in one transaction (a taken name or response
        id refuses it whole), ``audit`` recorded in it."""
        with self._write("cannot import the session file") as conn:
            transfer.write(conn, file, namespace, self.shared)
            if audit is not None:
                write_audit(conn, audit)

    def save_conversation(self, session: str, metadata: dict[str, str], created_at: int) -> None:
        """A conversation's metadata (its session need not exist yet); ``created_at`` is kept from the first save."""
        metadata, found = self._redacted(session, metadata)
        with self._write(f"cannot keep conversation {session!r}") as conn:
            conn.execute("INSERT INTO conversations (session, metadata, created_at) VALUES (?, ?, ?) ON CONFLICT "
                         "(session) DO UPDATE SET metadata = excluded.metadata", (session, canonical_json(metadata),
                                                                                created_at))
            self._seal(conn, session, found)

    def conversation(self, session: str) -> tuple[dict[str, str], int] | None:
        """A created conversation's metadata and creation time."""
        with self._read() as conn:
            row = conn.execute("SELECT metadata, created_at FROM conversations WHERE session = ?",
                               (session,)).fetchone()
        return None if row is None else (json.loads(row[0]), int(row[1]))

    # -- a request waiting on client tool results (the one mutable row of a session) -------------

    def save_pending(self, session: str, request: int, snapshot: dict[str, Any]) -> None:
        snapshot, found = self._redacted(session, snapshot)
        with self._write(f"cannot keep the waiting request of {session!r}") as conn:
            conn.execute("DELETE FROM pending_requests WHERE name = ?", (session,))
            conn.execute("INSERT INTO pending_requests (name, request, snapshot) VALUES (?, ?, ?)",
                         (session, request, json.dumps(snapshot, ensure_ascii=False)))
            self._seal(conn, session, found)

    def pending(self, session: str) -> dict[str, Any] | None:
        """The snapshot of the session's waiting request, if it still waits (not if it was finished since)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT p.request, p.snapshot, (SELECT COALESCE(MAX(r.idx), MAX(s.fork_at), 0) FROM sessions s"
                " LEFT JOIN requests r ON r.session_id = s.id WHERE s.name = p.name)"
                " FROM pending_requests p WHERE p.name = ?",
                (session,)).fetchone()
        if row is None or int(row[0]) != int(row[2]) + 1:
            return None
        return json.loads(row[1])  # type: ignore[no-any-return]

    def clear_pending(self, session: str) -> None:
        with self._write(f"cannot clear the waiting request of {session!r}") as conn:
            conn.execute("DELETE FROM pending_requests WHERE name = ?", (session,))

    def has_session(self, session: str) -> bool:
        with self._read() as conn:
            return self._session_id(conn, session) is not None

    def require_session(self, session: str) -> None:
        if not self.has_session(session):
            raise SessionNotFound(f"unknown session {session!r} in {self.path}")

    def request_count(self, session: str) -> int:
        """The session's finished requests (a fork's shared ones included)."""
        with self._read() as conn:
            return int(conn.execute(_LINE + "SELECT COALESCE(MAX(r.idx), MAX(l.fork_at), 0) FROM line l LEFT JOIN"
                                    " requests r ON r.session_id = l.sid AND r.idx <= l.upto",
                                    (session,)).fetchone()[0])

    def requests(self, session: str) -> list[RequestRow]:
        with self._read() as conn:
            rows = conn.execute(
                _LINE + "SELECT r.idx, r.query, r.response, r.unfinished, r.created_at, r.strategy FROM requests r"
                " JOIN line l ON r.session_id = l.sid AND r.idx <= l.upto ORDER BY r.idx", (session,)
            ).fetchall()
        return [RequestRow(int(i), q, r, u, None if c is None else int(c), m) for i, q, r, u, c, m in rows]

    def transcripts(self, session: str) -> dict[int, Transcript]:
        """The endpoint's records of the session's requests, by request index (requests persisted before
        migration 0006 kept theirs in the run record instead)."""
        with self._read() as conn:  # one query (a round trip matters on a server)
            rows = conn.execute(_LINE + "SELECT t.request_idx, t.messages, t.idempotency FROM transcripts t JOIN line l"
                                " ON t.session_id = l.sid AND t.request_idx <= l.upto ORDER BY t.request_idx",
                                (session,)).fetchall()
        return {int(i): Transcript(json.loads(m), json.loads(k)) for i, m, k in rows}

    def request_record(self, session: str, index: int) -> dict[str, Any] | None:
        """The run record stored with a finished request."""
        with self._read() as conn:
            row = conn.execute(
                _LINE + "SELECT r.record, r.session_id FROM requests r JOIN line l ON r.session_id = l.sid"
                " AND r.idx <= l.upto WHERE r.idx = ?", (session, index)
            ).fetchone()
            return parts.whole(conn, json.loads(row[0]), int(row[1])) if row else None

    # -- nodes -----------------------------------------------------------------------------

    def nodes(self, session: str) -> list[Node]:
        """Every node of the session in creation order."""
        with self._read() as conn:
            rows = conn.execute(
                _LINE + "SELECT n.node_id, n.kind, n.type, n.summary, n.value, n.request_idx, n.mark FROM nodes n "
                + _IN_LINE + " ORDER BY n.seq", (session,),
            ).fetchall()
            refs = self._refs(conn, session)
        return [self._node(row, refs.get(row[0], ())) for row in rows]

    def node(self, session: str, node_id: str) -> Node | None:
        """One node with its relations: one query (a round trip matters on a server)."""
        with self._read() as conn:
            rows = conn.execute(
                _LINE + "SELECT n.node_id, n.kind, n.type, n.summary, n.value, n.request_idx, n.mark, "
                        "r.rel, r.target_id"
                " FROM nodes n " + _IN_LINE +
                " LEFT JOIN relations r ON r.session_id = n.session_id AND r.source_id = n.node_id"
                " WHERE n.node_id = ? ORDER BY r.position",
                (session, node_id),
            ).fetchall()
        if not rows:
            return None
        refs = tuple(Ref(rel=rel, state_id=target) for *_, rel, target in rows if rel is not None)
        return self._node(rows[0][:7], refs)

    def incoming(self, session: str, node_id: str) -> list[tuple[str, str]]:
        """The (source id, relation) pairs of relations that point at ``node_id``."""
        with self._read() as conn:
            rows = conn.execute(
                _LINE + "SELECT r.source_id, r.rel FROM relations r"
                " JOIN nodes n ON n.session_id = r.session_id AND n.node_id = r.source_id " + _IN_LINE +
                " WHERE r.target_id = ? ORDER BY n.seq, r.position",
                (session, node_id),
            ).fetchall()
        return [(src, rel) for src, rel in rows]

    def disclosure(self, session: str, node_id: str) -> tuple[Node | None, list[tuple[str, str]]]:
        """A node with its relations, and the (source id, relation) pairs that point at it: what PSA's
        Disclose reads, in one query."""
        with self._read() as conn:
            rows = conn.execute(
                _LINE + "SELECT 0, n.node_id, n.kind, n.type, n.summary, n.value, n.request_idx, n.mark, r.rel,"
                " r.target_id, r.position, 0 FROM nodes n " + _IN_LINE +
                " LEFT JOIN relations r ON r.session_id = n.session_id AND r.source_id = n.node_id"
                " WHERE n.node_id = ?"
                " UNION ALL"
                " SELECT 1, r.source_id, NULL, NULL, NULL, NULL, NULL, NULL, r.rel, NULL, n.seq, r.position"
                " FROM relations r JOIN nodes n ON n.session_id = r.session_id AND n.node_id = r.source_id "
                + _IN_LINE + " WHERE r.target_id = ?"
                " ORDER BY 1, 11, 12",
                (session, node_id, node_id),
            ).fetchall()
        own = [r for r in rows if r[0] == 0]
        if not own:
            return None, []
        refs = tuple(Ref(rel=r[8], state_id=r[9]) for r in own if r[8] is not None)
        return self._node(own[0][1:8], refs), [(r[1], r[8]) for r in rows if r[0] == 1]

    @staticmethod
    def _refs(conn: Conn, session: str) -> dict[str, tuple[Ref, ...]]:
        """The relations of the session's nodes (a fork's shared ones included), by source id."""
        sql = (_LINE + "SELECT r.source_id, r.rel, r.target_id FROM relations r JOIN nodes n"
               " ON n.session_id = r.session_id AND n.node_id = r.source_id " + _IN_LINE)
        out: dict[str, list[Ref]] = {}
        for src, rel, target in conn.execute(sql + " ORDER BY r.source_id, r.position", (session,)):
            out.setdefault(src, []).append(Ref(rel=rel, state_id=target))
        return {k: tuple(v) for k, v in out.items()}

    @staticmethod
    def _node(row: Sequence[Any], refs: tuple[Ref, ...]) -> Node:
        node_id, kind, type_, summary, value, request_idx, mark = row
        return Node(id=node_id, kind=kind, type=type_, summary=summary, value=json.loads(value), refs=refs,
                    request=request_idx, mark=mark)

    # -- persist ---------------------------------------------------------------------------

    def persist_request(
        self,
        session: str,
        index: int,
        query: str,
        response: str | None,
        nodes: Sequence[Node],
        record: dict[str, Any],
        unfinished: str | None = None,
        transcript: Transcript | None = None,
        strategy: str | None = None,
    ) -> None:
        """Persist: the request, its new nodes (states and referenced observations) and their relations.

        One transaction. ``unfinished`` says why a request that has no response ended (step budget);
        ``transcript``: the endpoint's record of the request, kept beside it; ``strategy``: the memory method it ran
        under. The nodes are indexed for search in the same transaction.
        ``index`` must be the session's next request index; otherwise another
        writer finished a request of this session meanwhile and nothing is written.
        """
        sid = "(SELECT id FROM sessions WHERE name = ?)"  # no read before the writes: one round trip on a server
        query, response, nodes, record, transcript, found = (query, response, nodes, record, transcript, None) \
            if self._redaction is None else self._redaction.request(session, query, response, nodes, record, transcript)
        try:
            with self._write(f"cannot persist request {index} of {session!r}") as conn:
                now = int(time.time())
                conn.execute("INSERT INTO sessions (name, created_at, active_at) VALUES (?, ?, ?) ON CONFLICT (name)"
                             " DO UPDATE SET active_at = excluded.active_at", (session, now, now))
                conn.execute(  # the database refuses an index out of order (migration 0004)
                    "INSERT INTO requests (session_id, idx, query, response, record, unfinished, created_at, strategy)"
                    f" VALUES ({sid}, ?, ?, ?, ?, ?, ?, ?)",
                    (session, index, query, response, canonical_json(parts.lean(conn, record, sid, (session,))),
                     unfinished, now, strategy),
                )
                if nodes:
                    conn.executemany(
                        f"INSERT INTO nodes (session_id, node_id, kind, type, summary, value, request_idx, mark)"
                        f" VALUES ({sid}, ?, ?, ?, ?, ?, ?, ?)",
                        [(session, n.id, n.kind, n.type.value, n.summary, canonical_json(n.value), index, n.mark)
                         for n in nodes],
                    )
                    conn.executemany(fts.index_sql(self.shared), fts.index_rows(session, nodes))
                if transcript is not None:
                    messages, keys = canonical_json(transcript.messages), canonical_json(transcript.idempotency)
                    conn.execute("INSERT INTO transcripts (session_id, request_idx, messages, idempotency)"
                                 f" VALUES ({sid}, ?, ?, ?)", (session, index, messages, keys))
                self._seal(conn, session, found)
                relations = [(session, n.id, pos, ref.rel.value, ref.state_id) for n in nodes
                             for pos, ref in enumerate(n.refs)]
                _check_targets(conn, session, index, nodes)
                if relations:
                    conn.executemany("INSERT INTO relations (session_id, source_id, position, rel, target_id)"
                                     f" VALUES ({sid}, ?, ?, ?, ?)", relations)
        except StorageError as exc:
            if "out of order" not in str(exc):
                raise
            done = self.request_count(session)
            raise StorageError(f"session {session!r}: request {index} conflicts with {done} finished requests"
                               " (was the session used concurrently?)") from exc



def _check_targets(conn: Conn, session: str, index: int, nodes: Sequence[Node]) -> None:
    """Every relation of a request's new nodes ends at a node of the session (its own, or one a fork shares): the
    database's own foreign key cannot say so across a fork, so the repository does, in the request's transaction."""
    outside = sorted({ref.state_id for n in nodes for ref in n.refs} - {n.id for n in nodes})
    if not outside:
        return
    marks = ", ".join("?" for _ in outside)
    found = {r[0] for r in conn.execute(_LINE + "SELECT n.node_id FROM nodes n " + _IN_LINE +
                                        f" WHERE n.node_id IN ({marks})", (session, *outside))}
    missing = [t for t in outside if t not in found]
    if missing:
        raise StorageError(f"cannot persist request {index} of {session!r}: relations end at {', '.join(missing)},"
                           " no node of the session")
