"""A session's lineage: forks that share their parent's first requests without a copy of them, read through one
recursive query (``line.LINE``) that every read of a session's requests, nodes, relations and transcripts joins; and
what a poll compares (``Lineage.version``)."""

from __future__ import annotations

import time

from flowstate.errors import SessionNotFound, StorageError
from flowstate.store.backends import Backend, Conn
from flowstate.store.line import LINE


def session_id(conn: Conn, session: str) -> int | None:
    """The stored session's row id, or None."""
    row = conn.execute("SELECT id FROM sessions WHERE name = ?", (session,)).fetchone()
    return int(row[0]) if row else None


class Lineage:
    """Forks: made, dropped while empty, and read both ways; and each session's stored version."""

    def __init__(self, backend: Backend) -> None:
        self._db = backend

    def fork(self, session: str, at: int, name: str) -> None:
        """A new session ``name`` that shares ``session``'s first ``at`` requests — their nodes, relations and
        transcripts — without copying them, and goes on from there on its own (its next request is ``at + 1``).
        Forking a fork at or before its own point shares from the session that holds those requests. Forking again
        under the same name at the same point is a no-op (a retried call); any other existing name is refused."""
        with self._db.write(f"cannot fork session {session!r} at request {at}") as conn:
            row = conn.execute("SELECT id, parent_id, fork_at FROM sessions WHERE name = ?", (session,)).fetchone()
            if row is None:
                raise SessionNotFound(f"unknown session {session!r} in {self._db.label}")
            sid, parent, fork_at = int(row[0]), row[1], int(row[2])
            done = int(conn.execute(LINE + "SELECT COALESCE(MAX(r.idx), 0) FROM requests r JOIN line l"
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
        with self._db.write(f"cannot drop fork {session!r}") as conn:
            sid = session_id(conn, session)
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
        with self._db.read() as conn:
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
        with self._db.read() as conn:
            row = conn.execute("SELECT p.name, s.fork_at FROM sessions s JOIN sessions p ON p.id = s.parent_id"
                               " WHERE s.name = ?", (session,)).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def forks(self, session: str) -> list[tuple[str, int]]:
        """The sessions forked from this one, with the requests each shares, in creation order."""
        with self._db.read() as conn:
            return [(r[0], int(r[1])) for r in conn.execute(
                "SELECT c.name, c.fork_at FROM sessions c JOIN sessions p ON p.id = c.parent_id WHERE p.name = ?"
                " ORDER BY c.id", (session,))]
