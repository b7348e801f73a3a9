"""A request waiting on client tool results: the one mutable row of a session, its loop's snapshot kept until the
results come (and then the request finishes and the row is cleared)."""

from __future__ import annotations

import json
from typing import Any

from flowstate.store.backends import Backend
from flowstate.store.conversations import Redact, Seal


class WaitingRequests:
    """Each session's waiting request, at most one, redacted as everything else stored."""

    def __init__(self, backend: Backend, redacted: Redact, seal: Seal) -> None:
        self._db, self._redacted, self._seal = backend, redacted, seal

    def save(self, session: str, request: int, snapshot: dict[str, Any]) -> None:
        snapshot, found = self._redacted(session, snapshot)
        with self._db.write(f"cannot keep the waiting request of {session!r}") as conn:
            conn.execute("DELETE FROM pending_requests WHERE name = ?", (session,))
            conn.execute("INSERT INTO pending_requests (name, request, snapshot) VALUES (?, ?, ?)",
                         (session, request, json.dumps(snapshot, ensure_ascii=False)))
            self._seal(conn, session, found)

    def get(self, session: str) -> dict[str, Any] | None:
        """The snapshot of the session's waiting request, if it still waits (not if it was finished since)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT p.request, p.snapshot, (SELECT COALESCE(MAX(r.idx), MAX(s.fork_at), 0) FROM sessions s"
                " LEFT JOIN requests r ON r.session_id = s.id WHERE s.name = p.name)"
                " FROM pending_requests p WHERE p.name = ?",
                (session,)).fetchone()
        if row is None or int(row[0]) != int(row[2]) + 1:
            return None
        return json.loads(row[1])  # type: ignore[no-any-return]

    def clear(self, session: str) -> None:
        with self._db.write(f"cannot clear the waiting request of {session!r}") as conn:
            conn.execute("DELETE FROM pending_requests WHERE name = ?", (session,))
