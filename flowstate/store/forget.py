"""How a session's rows go, inside the caller's write transaction: the one deletion of history there is, shared by
``DELETE /v1/sessions/{id}``, retention's sweep and erasure. Everything the session owns goes with it: requests,
nodes (their search rows by trigger or cascade), relations, transcripts (the Idempotency-Keys they hold), the parts
of its run records, its waiting request, its stored responses, its conversation, the values redaction kept for it in
the vault and the feedback on its requests. A session that forks share requests with stays."""

from __future__ import annotations

from flowstate.errors import SessionHasForks
from flowstate.store.backends import Conn

_OWNED = ("relations", "nodes", "transcripts", "record_parts", "requests")


def one_at_a_time(conn: Conn, session: str, shared: bool) -> None:
    """Serialize this transaction with every other that deletes the session or stores a response only while it
    is stored (PostgreSQL: a transaction-scoped advisory lock, its own key space beside the turns' session lock;
    under READ COMMITTED a response's check could otherwise see a session a deletion has not committed yet, and keep
    the response after it). SQLite's one writer serializes them already."""
    if shared:
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 1))", (session,))


def turn_holds(conn: Conn, session: str, shared: bool) -> bool:
    """Whether a turn on some server holds the session now (PostgreSQL: its session lock is taken). When it is
    free, this transaction takes it until it ends, so no turn starts in the session meanwhile. False on SQLite,
    whose one server knows its own turns (``serving.registry``)."""
    if not shared:
        return False
    got = conn.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(?, 0))", (session,)).fetchone()
    return not got[0]


def delete_session(conn: Conn, session: str, shared: bool) -> bool:
    """Delete the session and all it owns; ``SessionHasForks`` (before anything is deleted) while forks share
    its requests. Whether there was anything to delete."""
    one_at_a_time(conn, session, shared)
    row = conn.execute("SELECT id FROM sessions WHERE name = ?", (session,)).fetchone()
    sid = None if row is None else int(row[0])
    if sid is not None:
        forks = [r[0] for r in conn.execute("SELECT name FROM sessions WHERE parent_id = ? ORDER BY id", (sid,))]
        if forks:
            raise SessionHasForks(session, forks)
    waiting = conn.execute("DELETE FROM pending_requests WHERE name = ? RETURNING name", (session,)).fetchone()
    conn.execute("DELETE FROM responses WHERE session = ?", (session,))  # by name: stored before any request
    conn.execute("DELETE FROM vault WHERE session = ?", (session,))  # the values redaction kept for it
    conn.execute("DELETE FROM feedback WHERE session = ?", (session,))  # what its users said of its requests
    created = conn.execute("DELETE FROM conversations WHERE session = ? RETURNING session", (session,)).fetchone()
    if sid is None:
        return waiting is not None or created is not None
    conn.execute("UPDATE sessions SET forgetting = 1 WHERE id = ?", (sid,))
    for table in _OWNED:
        conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (sid,))
    conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))
    return True
