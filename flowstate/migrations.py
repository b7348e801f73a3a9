"""Named, ordered, idempotent schema migrations of the SQLite repository."""

from __future__ import annotations

import sqlite3

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_initial",
        """
        CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE
        );
        CREATE TABLE requests (
            session_id INTEGER NOT NULL REFERENCES sessions(id),
            idx INTEGER NOT NULL,
            query TEXT NOT NULL,
            response TEXT,
            record TEXT NOT NULL,
            PRIMARY KEY (session_id, idx)
        );
        CREATE TABLE nodes (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id INTEGER NOT NULL REFERENCES sessions(id),
            node_id TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('state', 'observation')),
            type TEXT NOT NULL,
            summary TEXT NOT NULL,
            value TEXT NOT NULL,
            request_idx INTEGER NOT NULL,
            UNIQUE (session_id, node_id),
            FOREIGN KEY (session_id, request_idx) REFERENCES requests(session_id, idx)
        );
        CREATE TABLE relations (
            session_id INTEGER NOT NULL REFERENCES sessions(id),
            source_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            rel TEXT NOT NULL,
            target_id TEXT NOT NULL,
            PRIMARY KEY (session_id, source_id, position),
            FOREIGN KEY (session_id, source_id) REFERENCES nodes(session_id, node_id),
            FOREIGN KEY (session_id, target_id) REFERENCES nodes(session_id, node_id)
        );
        CREATE INDEX relations_target ON relations(session_id, target_id);
        -- Historical nodes, their relations and finished requests are never changed or deleted.
        CREATE TRIGGER nodes_no_update BEFORE UPDATE ON nodes
            BEGIN SELECT RAISE(ABORT, 'historical nodes are immutable'); END;
        CREATE TRIGGER nodes_no_delete BEFORE DELETE ON nodes
            BEGIN SELECT RAISE(ABORT, 'historical nodes are immutable'); END;
        CREATE TRIGGER relations_no_update BEFORE UPDATE ON relations
            BEGIN SELECT RAISE(ABORT, 'historical relations are immutable'); END;
        CREATE TRIGGER relations_no_delete BEFORE DELETE ON relations
            BEGIN SELECT RAISE(ABORT, 'historical relations are immutable'); END;
        CREATE TRIGGER requests_no_update BEFORE UPDATE ON requests
            BEGIN SELECT RAISE(ABORT, 'finished requests are immutable'); END;
        """,
    ),
    (
        "0002_forget_sessions",
        """
        -- Deleting a whole session is the one way to forget, and it is explicit: rows may go only
        -- while their session is marked as being forgotten (Repository.delete_session).
        ALTER TABLE sessions ADD COLUMN forgetting INTEGER NOT NULL DEFAULT 0;
        DROP TRIGGER nodes_no_delete;
        DROP TRIGGER relations_no_delete;
        CREATE TRIGGER nodes_no_delete BEFORE DELETE ON nodes
            WHEN (SELECT forgetting FROM sessions WHERE id = OLD.session_id) IS NOT 1
            BEGIN SELECT RAISE(ABORT, 'historical nodes are immutable'); END;
        CREATE TRIGGER relations_no_delete BEFORE DELETE ON relations
            WHEN (SELECT forgetting FROM sessions WHERE id = OLD.session_id) IS NOT 1
            BEGIN SELECT RAISE(ABORT, 'historical relations are immutable'); END;
        CREATE TRIGGER requests_no_delete BEFORE DELETE ON requests
            WHEN (SELECT forgetting FROM sessions WHERE id = OLD.session_id) IS NOT 1
            BEGIN SELECT RAISE(ABORT, 'finished requests are immutable'); END;
        """,
    ),
    (
        "0003_unfinished_requests",
        """
        -- A request that ran out of its step budget is persisted with what it had; this says why it
        -- has no response (NULL for every answered request).
        ALTER TABLE requests ADD COLUMN unfinished TEXT;
        """,
    ),
]


def apply(conn: sqlite3.Connection) -> list[str]:
    """Apply the migrations not yet recorded in ``schema_migrations``; return their names."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY)")
    done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
    applied: list[str] = []
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # re-check under the write lock: another process may have applied it meanwhile
            if conn.execute("SELECT 1 FROM schema_migrations WHERE name = ?", (name,)).fetchone():
                conn.execute("ROLLBACK")
                continue
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (name) VALUES (?)", (name,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit our transaction)."""
    out: list[str] = []
    buf = ""
    for line in sql.splitlines(keepends=True):
        if line.strip().startswith("--"):
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
