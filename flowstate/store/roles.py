"""A PostgreSQL role for the servers that owns nothing: ``flowstate grant ROLE --db OWNER_URL`` gives it what a server
does — read and write every table, the audit trail only read and appended to — and no more. The role that made the
tables (the owner) may still drop a trigger or a table; a server's role cannot, so a server, or whoever holds its URL,
cannot rewrite the trail (docs/tenants.md). Run again after an upgrade whose migrations made tables."""

from __future__ import annotations

from typing import Any

APPEND_ONLY = ("audit", "audit_chain")  # read and appended to, never changed or removed


def grant(conn: Any, role: str) -> list[str]:
    """Grant ``role`` (an existing role) a server's rights on the connection's database and schema ``public``, on a
    psycopg connection of the tables' owner; return the statements run."""
    from psycopg import sql

    who = sql.Identifier(role)
    found = conn.execute("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if found is None:
        raise ValueError(f"no role {role!r} on this server (CREATE ROLE {role} LOGIN PASSWORD '…' first)")
    if found[0]:
        raise ValueError(f"role {role!r} is a superuser: it passes every check; grant to a role of its own")
    database = conn.execute("SELECT current_database()").fetchone()[0]
    statements = [
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), who),
        sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(who),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(who),
        sql.SQL("REVOKE UPDATE, DELETE, TRUNCATE ON {} FROM {}").format(
            sql.SQL(", ").join(map(sql.Identifier, APPEND_ONLY)), who),
        sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(who),
    ]
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)
    return [statement.as_string(conn) for statement in statements]
