"""The Responses API's stored responses and background responses' leases (``repo.responses``): a response stored
with its session, its place in the session's transcript, its object and its input items, redacted as everything the
repository stores; a background response's lease, renewed while its server runs it and failed once it is not."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flowstate.nodes import canonical_json
from flowstate.store import forget
from flowstate.store.backends import Backend, Conn
from flowstate.store.redaction import Redacted

Redact = Callable[[str, Any], tuple[Any, Redacted | None]]
Seal = Callable[[Conn, str, Redacted | None], None]


@dataclass(frozen=True)
class StoredResponse:
    """A response of the Responses API as stored: whose it is (key namespace, session), where it ends in the
    session's transcript, the response object and its input items."""

    id: str
    namespace: str
    session: str
    position: int
    body: dict[str, Any]
    input_items: list[dict[str, Any]]


class ResponseStore:
    """Stored responses and their leases, redacted by the repository's ``redact`` and ``seal`` (the repository's
    own: whatever redaction it applies now)."""

    def __init__(self, backend: Backend, shared: bool, redact: Redact, seal: Seal) -> None:
        self._db, self.shared, self._redacted, self._seal = backend, shared, redact, seal
        self._write = backend.write
        self._read = backend.read

    def save(self, response: StoredResponse, created_at: int, lease_at: int | None = None, *,
                      if_session: bool = False) -> bool:
        """Store a new response (its id must be new); ``lease_at``: a background response's, stored as it starts.
        ``if_session``: only while its session is stored (a turn's response, stored after the turn: a session
        deleted meanwhile keeps nothing of it). Whether it was stored."""
        (body, items), found = self._redacted(response.session, [response.body, response.input_items])
        response = replace(response, body=body, input_items=items)
        values = (response.id, response.namespace, response.session, response.position, canonical_json(response.body),
                  canonical_json(response.input_items), created_at, lease_at)
        insert = "INSERT INTO responses (id, namespace, session, position, body, input_items, created_at, lease_at) "
        with self._write(f"cannot store response {response.id!r}") as conn:
            if not if_session:
                conn.execute(insert + "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values)
                self._seal(conn, response.session, found)
                return True
            forget.one_at_a_time(conn, response.session, self.shared)
            done = conn.execute(insert + "SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE name"
                                " = ?) OR EXISTS (SELECT 1 FROM pending_requests WHERE name = ?) RETURNING id",
                                (*values, response.session, response.session)).fetchone() is not None
            if done:
                self._seal(conn, response.session, found)
            return done

    def update(self, response: StoredResponse) -> bool:
        """A background response stored again as its turn ended (its lease gone): only while it is stored — one
        deleted meanwhile (alone, or with its session) stays deleted. Whether it was."""
        (body, items), found = self._redacted(response.session, [response.body, response.input_items])
        with self._write(f"cannot store response {response.id!r}") as conn:
            done = conn.execute(
                "UPDATE responses SET position = ?, body = ?, input_items = ?, lease_at = NULL"
                " WHERE id = ? AND namespace = ? AND session = ? RETURNING id",
                (response.position, canonical_json(body), canonical_json(items), response.id,
                 response.namespace, response.session)).fetchone() is not None
            if done:
                self._seal(conn, response.session, found)
            return done

    def renew(self, ids: Sequence[str], now: int) -> None:
        """The background responses this server runs are still running."""
        if ids:
            with self._write("cannot renew background leases") as conn:
                marks = ", ".join("?" for _ in ids)
                conn.execute(f"UPDATE responses SET lease_at = ? WHERE lease_at IS NOT NULL AND id IN ({marks})",
                             (now, *ids))

    def expire(self, before: int, error: dict[str, str]) -> list[str]:
        """Fail every background response whose lease was last renewed before ``before`` (its server stopped):
        its stored body says ``failed`` with ``error``; the ids."""
        with self._write("cannot expire background leases") as conn:
            rows = conn.execute("SELECT id, body, lease_at FROM responses WHERE lease_at IS NOT NULL AND lease_at < ?",
                                (before,)).fetchall()
            for rid, body, lease in rows:
                obj = {**json.loads(body), "status": "failed", "error": error}
                conn.execute("UPDATE responses SET body = ?, lease_at = NULL WHERE id = ? AND lease_at = ?",
                             (canonical_json(obj), rid, lease))
        return [r[0] for r in rows]

    def get(self, response_id: str, namespace: str) -> StoredResponse | None:
        """The stored response with this id, if it is the namespace's (another key's response is not found)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT session, position, body, input_items FROM responses WHERE id = ? AND namespace = ?",
                (response_id, namespace)).fetchone()
        if row is None:
            return None
        return StoredResponse(response_id, namespace, row[0], int(row[1]), json.loads(row[2]), json.loads(row[3]))

    def delete(self, response_id: str, namespace: str) -> bool:
        """Forget a stored response (not what its request left in the session's memory); False if there is none."""
        with self._write(f"cannot delete response {response_id!r}") as conn:
            done = conn.execute("DELETE FROM responses WHERE id = ? AND namespace = ? RETURNING id",
                                (response_id, namespace))
            return done.fetchone() is not None
