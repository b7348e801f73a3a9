"""What is kept beside each finished request: the endpoint's transcript of it (its messages and Idempotency-Keys)
and the loop's run record (its steps, whole again from its stored parts)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from flowstate.store import parts
from flowstate.store.backends import Backend
from flowstate.store.line import LINE


@dataclass(frozen=True)
class Transcript:
    """The endpoint's record of one request: its messages as the server saw and answered them, and its
    Idempotency-Keys (key -> offset of the reply within ``messages``)."""

    messages: list[dict[str, Any]]
    idempotency: dict[str, int]


class RequestRecords:
    """A session's transcripts and run records, a fork's shared ones included."""

    def __init__(self, backend: Backend) -> None:
        self._db = backend

    def transcripts(self, session: str) -> dict[int, Transcript]:
        """The endpoint's records of the session's requests, by request index (requests persisted before
        migration 0006 kept theirs in the run record instead)."""
        with self._db.read() as conn:  # one query (a round trip matters on a server)
            rows = conn.execute(LINE + "SELECT t.request_idx, t.messages, t.idempotency FROM transcripts t JOIN line l"
                                " ON t.session_id = l.sid AND t.request_idx <= l.upto ORDER BY t.request_idx",
                                (session,)).fetchall()
        return {int(i): Transcript(json.loads(m), json.loads(k)) for i, m, k in rows}

    def request(self, session: str, index: int) -> dict[str, Any] | None:
        """The run record stored with a finished request."""
        with self._db.read() as conn:
            row = conn.execute(
                LINE + "SELECT r.record, r.session_id FROM requests r JOIN line l ON r.session_id = l.sid"
                " AND r.idx <= l.upto WHERE r.idx = ?", (session, index)
            ).fetchone()
            return parts.whole(conn, json.loads(row[0]), int(row[1])) if row else None
