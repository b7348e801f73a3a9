"""The Persistent State Repository M_k: sessions, requests, nodes, relations, on SQLite or PostgreSQL.

A request is persisted in one transaction at its end, so a crash loses at most the unfinished
request and never leaves half of one. Nothing here changes or deletes a persisted node.

``Repository`` owns the connection and what M is (a session's requests and nodes, written and read); every other
resource is a store of its own that it makes on the same connection — forks (``lineage``), the lists of sessions
and search (``catalog``), session files (``transfer``), transcripts and run records (``records``), a request
waiting on tool results (``waiting``), conversations, stored responses, tenants, quotas, audit, retention,
erasure and feedback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowstate.errors import StorageError
from flowstate.nodes import Node, Ref, canonical_json
from flowstate.store import forget, parts
from flowstate.store import search as fts
from flowstate.store.audit import AuditLog, Entry
from flowstate.store.audit import write as write_audit
from flowstate.store.backends import Backend, Conn, PostgresBackend, open_backend
from flowstate.store.catalog import Catalog, SessionSummary
from flowstate.store.conversations import ConversationStore
from flowstate.store.erasure import ErasureStore
from flowstate.store.feedback import FeedbackStore
from flowstate.store.line import IN_LINE, LINE
from flowstate.store.lineage import Lineage, session_id
from flowstate.store.quotas import QuotaStore
from flowstate.store.redaction import Redacted
from flowstate.store.responses import ResponseStore
from flowstate.store.retention import RetentionStore
from flowstate.store.tenants import TenantStore
from flowstate.store.transcripts import RequestRecords, Transcript
from flowstate.store.transfer import Transfer
from flowstate.store.vault import Redaction
from flowstate.store.waiting import WaitingRequests

__all__ = ["RequestRow", "Repository", "SessionSummary", "SessionView", "Transcript"]



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
class SessionView:
    """Read access to one session's M: what PSA's Disclose and a memory method's ``start`` see (never the other
    sessions of the repository)."""

    _repo: Repository
    session: str

    def node(self, node_id: str) -> Node | None:
        return self._repo.node(self.session, node_id)

    def incoming(self, node_id: str) -> list[tuple[str, str]]:
        return self._repo.disclosure(self.session, node_id)[1]

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
        self.lineage = Lineage(backend)  # forks, and what a poll compares (flowstate/store/lineage.py)
        self.catalog = Catalog(backend, self.shared)  # a page of sessions, a page of search hits
        self.transfer = Transfer(backend, self.shared)  # session files out and in (flowstate/store/transfer.py)
        self.records = RequestRecords(backend)  # each finished request's transcript and run record
        self.waiting = WaitingRequests(backend, self._redacted, self._seal)  # a request waiting on tool results
        self.conversations = ConversationStore(backend, self._redacted, self._seal)  # Responses' conversations

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

    def has_session(self, session: str) -> bool:
        with self._read() as conn:
            return session_id(conn, session) is not None

    def request_count(self, session: str) -> int:
        """The session's finished requests (a fork's shared ones included)."""
        with self._read() as conn:
            return int(conn.execute(LINE + "SELECT COALESCE(MAX(r.idx), MAX(l.fork_at), 0) FROM line l LEFT JOIN"
                                    " requests r ON r.session_id = l.sid AND r.idx <= l.upto",
                                    (session,)).fetchone()[0])

    def requests(self, session: str) -> list[RequestRow]:
        with self._read() as conn:
            rows = conn.execute(
                LINE + "SELECT r.idx, r.query, r.response, r.unfinished, r.created_at, r.strategy FROM requests r"
                " JOIN line l ON r.session_id = l.sid AND r.idx <= l.upto ORDER BY r.idx", (session,)
            ).fetchall()
        return [RequestRow(int(i), q, r, u, None if c is None else int(c), m) for i, q, r, u, c, m in rows]

    # -- nodes -----------------------------------------------------------------------------

    def nodes(self, session: str) -> list[Node]:
        """Every node of the session in creation order."""
        with self._read() as conn:
            rows = conn.execute(
                LINE + "SELECT n.node_id, n.kind, n.type, n.summary, n.value, n.request_idx, n.mark FROM nodes n "
                + IN_LINE + " ORDER BY n.seq", (session,),
            ).fetchall()
            refs = self._refs(conn, session)
        return [self._node(row, refs.get(row[0], ())) for row in rows]

    def node(self, session: str, node_id: str) -> Node | None:
        """One node with its relations: one query (a round trip matters on a server)."""
        with self._read() as conn:
            rows = conn.execute(
                LINE + "SELECT n.node_id, n.kind, n.type, n.summary, n.value, n.request_idx, n.mark, "
                        "r.rel, r.target_id"
                " FROM nodes n " + IN_LINE +
                " LEFT JOIN relations r ON r.session_id = n.session_id AND r.source_id = n.node_id"
                " WHERE n.node_id = ? ORDER BY r.position",
                (session, node_id),
            ).fetchall()
        if not rows:
            return None
        refs = tuple(Ref(rel=rel, state_id=target) for *_, rel, target in rows if rel is not None)
        return self._node(rows[0][:7], refs)

    def disclosure(self, session: str, node_id: str) -> tuple[Node | None, list[tuple[str, str]]]:
        """A node with its relations, and the (source id, relation) pairs that point at it: what PSA's
        Disclose reads, in one query."""
        with self._read() as conn:
            rows = conn.execute(
                LINE + "SELECT 0, n.node_id, n.kind, n.type, n.summary, n.value, n.request_idx, n.mark, r.rel,"
                " r.target_id, r.position, 0 FROM nodes n " + IN_LINE +
                " LEFT JOIN relations r ON r.session_id = n.session_id AND r.source_id = n.node_id"
                " WHERE n.node_id = ?"
                " UNION ALL"
                " SELECT 1, r.source_id, NULL, NULL, NULL, NULL, NULL, NULL, r.rel, NULL, n.seq, r.position"
                " FROM relations r JOIN nodes n ON n.session_id = r.session_id AND n.node_id = r.source_id "
                + IN_LINE + " WHERE r.target_id = ?"
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
        sql = (LINE + "SELECT r.source_id, r.rel, r.target_id FROM relations r JOIN nodes n"
               " ON n.session_id = r.session_id AND n.node_id = r.source_id " + IN_LINE)
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
    found = {r[0] for r in conn.execute(LINE + "SELECT n.node_id FROM nodes n " + IN_LINE +
                                        f" WHERE n.node_id IN ({marks})", (session, *outside))}
    missing = [t for t in outside if t not in found]
    if missing:
        raise StorageError(f"cannot persist request {index} of {session!r}: relations end at {', '.join(missing)},"
                           " no node of the session")
