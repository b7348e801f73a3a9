"""A Responses API conversation's own record: its metadata and when it was made (its items are its session's)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from flowstate.nodes import canonical_json
from flowstate.store.backends import Backend, Conn
from flowstate.store.redaction import Redacted

Redact = Callable[[str, Any], tuple[Any, "Redacted | None"]]
Seal = Callable[[Conn, str, "Redacted | None"], None]


class ConversationStore:
    """ConversationStore' metadata, redacted as everything else stored."""

    def __init__(self, backend: Backend, redacted: Redact, seal: Seal) -> None:
        self._db, self._redacted, self._seal = backend, redacted, seal

    def save(self, session: str, metadata: dict[str, str], created_at: int) -> None:
        """A conversation's metadata (its session need not exist yet); ``created_at`` is kept from the first save."""
        metadata, found = self._redacted(session, metadata)
        with self._db.write(f"cannot keep conversation {session!r}") as conn:
            conn.execute("INSERT INTO conversations (session, metadata, created_at) VALUES (?, ?, ?) ON CONFLICT "
                         "(session) DO UPDATE SET metadata = excluded.metadata", (session, canonical_json(metadata),
                                                                                created_at))
            self._seal(conn, session, found)

    def get(self, session: str) -> tuple[dict[str, str], int] | None:
        """A created conversation's metadata and creation time."""
        with self._db.read() as conn:
            row = conn.execute("SELECT metadata, created_at FROM conversations WHERE session = ?",
                               (session,)).fetchone()
        return None if row is None else (json.loads(row[0]), int(row[1]))
