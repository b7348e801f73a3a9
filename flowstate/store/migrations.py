"""Named, ordered, idempotent schema migrations of the repository, one list per backend.

Both lists have the same names and give the same schema and guarantees (history immutable unless its
session is being forgotten), each in its database's dialect.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from flowstate.store import chain, search

# The parts whose text is the same in both dialects (but for the words each fills in)
_PENDING = """
        -- A request waiting on its client's tool results, by session name: what it built so far (a JSON
        -- snapshot), so that any server, or this one after a restart, can go on with it. The one row that
        -- changes: written while a request waits, removed when it ends.
        CREATE TABLE pending_requests (
            name TEXT PRIMARY KEY,
            request INTEGER NOT NULL,
            snapshot TEXT NOT NULL
        );
        """
_TRANSCRIPTS = """
        -- The endpoint's record of a finished request, beside it rather than inside its run record: the
        -- request's messages as the server saw and answered them, and its Idempotency-Keys (key -> offset
        -- of the reply within those messages). Written in the request's transaction, gone with its session.
        CREATE TABLE transcripts (
            session_id {id_type} NOT NULL REFERENCES sessions(id),
            request_idx INTEGER NOT NULL,
            messages TEXT NOT NULL,
            idempotency TEXT NOT NULL,
            PRIMARY KEY (session_id, request_idx),
            FOREIGN KEY (session_id, request_idx) REFERENCES requests(session_id, idx)
        );
        """

_RESPONSES = """
        -- The Responses API's stored responses (serving/responses): by id, the caller's key namespace, the session
        -- the response belongs to (by name, like pending_requests: a response that ends in the client's tool calls
        -- exists before its request is persisted) and where it ends in that session's transcript (a later
        -- response continues from there). The response object and its input items, as JSON. Removed one by one
        -- (DELETE /v1/responses/{{id}}: the session's memory stays) or with their session.
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            namespace TEXT NOT NULL,
            session TEXT NOT NULL,
            position INTEGER NOT NULL,
            body TEXT NOT NULL,
            input_items TEXT NOT NULL,
            created_at {id_type} NOT NULL
        );
        CREATE INDEX responses_session ON responses(session);
        -- The Responses API's conversations are sessions; what a conversation has beyond its session: its metadata
        -- and when it was created (a session used as a conversation without being created has neither)
        CREATE TABLE conversations (
            session TEXT PRIMARY KEY,
            metadata TEXT NOT NULL,
            created_at {id_type} NOT NULL
        );
        """

_TABLES = """
        CREATE TABLE sessions (
            id {key},
            name TEXT NOT NULL UNIQUE
        );
        CREATE TABLE requests (
            session_id {id_type} NOT NULL REFERENCES sessions(id),
            idx INTEGER NOT NULL,
            query TEXT NOT NULL,
            response TEXT,
            record TEXT NOT NULL,
            PRIMARY KEY (session_id, idx)
        );
        CREATE TABLE nodes (
            seq {seq},
            session_id {id_type} NOT NULL REFERENCES sessions(id),
            node_id TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('state', 'observation')),
            type TEXT NOT NULL,
            summary TEXT NOT NULL,
            value TEXT NOT NULL,
            request_idx INTEGER NOT NULL,
            UNIQUE (session_id, node_id),
            FOREIGN KEY (session_id, request_idx) REFERENCES requests(session_id, idx)
        );
        {relations}"""
_RELATIONS = """CREATE TABLE {name} (
            session_id {id_type} NOT NULL REFERENCES sessions(id),
            source_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            rel TEXT NOT NULL,
            target_id TEXT NOT NULL,
            PRIMARY KEY (session_id, source_id, position),
            FOREIGN KEY (session_id, source_id) REFERENCES nodes(session_id, node_id){target_key}
        );
        """
_TARGET_KEY = ",\n            FOREIGN KEY (session_id, target_id) REFERENCES nodes(session_id, node_id)"
_RELATIONS_INDEX = "CREATE INDEX relations_target ON relations(session_id, target_id);\n        "


def _tables(key: str, seq: str, id_type: str) -> str:
    """The first migration's tables in a dialect (relations with their target's foreign key, as before forks)."""
    relations = _RELATIONS.format(name="relations", id_type=id_type, target_key=_TARGET_KEY) + "        " + \
        _RELATIONS_INDEX
    return _TABLES.format(key=key, seq=seq, id_type=id_type, relations=relations)
_UNFINISHED = """
        -- A request that ran out of its step budget is persisted with what it had; this says why it
        -- has no response (NULL for every answered request).
        ALTER TABLE requests ADD COLUMN unfinished TEXT;
        """
_FORGETTING = """
        -- Deleting a whole session is the one way to forget, and it is explicit: rows may go only
        -- while their session is marked as being forgotten (Repository.delete_session).
        ALTER TABLE sessions ADD COLUMN forgetting INTEGER NOT NULL DEFAULT 0;
"""
_IN_ORDER = """
        -- A session's requests are numbered 1, 2, 3, ...: the database refuses any other next index, so two
        -- writers finishing the same request of one session can never both succeed. (MAX, not COUNT: an
        -- index seek, whatever the session's length; requests are only ever deleted with their session.)
"""
_MARKS = """
        -- A memory method marks the nodes it makes itself (MAGE's summaries and pointers, Mem0-style facts, the
        -- ZipAct state, no-isu's rule-built response) with a declared kind, which no model output can write,
        -- instead of an id prefix a model could write too. Nodes stored before are marked once by those
        -- prefixes (the one time history is rewritten, inside this migration).
"""

_FORKS = """
        -- A session may be a fork: it shares the first fork_at requests of its parent (their nodes, relations and
        -- transcripts, read through the repository's lineage join, never copied) and numbers its own requests from
        -- fork_at + 1. A relation of a fork's node may end at a node its parent holds, so the relations' foreign key on
        -- the target goes: the repository checks every target against the session's lineage in the request's
        -- transaction instead (the key on the source stays).
        ALTER TABLE sessions ADD COLUMN parent_id {id_type} REFERENCES sessions(id);
        ALTER TABLE sessions ADD COLUMN fork_at INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX sessions_parent ON sessions(parent_id);
"""
_RELATIONS_NO_TARGET_KEY = "\n        " + _RELATIONS.format(name="relations_0009", id_type="INTEGER",
                                                            target_key="") + """\
        INSERT INTO relations_0009 SELECT session_id, source_id, position, rel, target_id FROM relations;
        DROP TABLE relations;
        ALTER TABLE relations_0009 RENAME TO relations;
        """ + _RELATIONS_INDEX + """CREATE TRIGGER relations_no_update BEFORE UPDATE ON relations
            BEGIN SELECT RAISE(ABORT, 'historical relations are immutable'); END;
        CREATE TRIGGER relations_no_delete BEFORE DELETE ON relations
            WHEN (SELECT forgetting FROM sessions WHERE id = OLD.session_id) IS NOT 1
            BEGIN SELECT RAISE(ABORT, 'historical relations are immutable'); END;
"""

_ACTIVITY = """
        -- When a session was created and last finished a request (unix seconds; 0 and NULL for what came before),
        -- for listing sessions newest first; when each request was persisted, and by which memory method (NULL
        -- before): what an operator's console and the search's date filters read.
        ALTER TABLE sessions ADD COLUMN created_at {id_type};
        ALTER TABLE sessions ADD COLUMN active_at {id_type} NOT NULL DEFAULT 0;
        CREATE INDEX sessions_active ON sessions(active_at, id);
        ALTER TABLE requests ADD COLUMN created_at {id_type};
        ALTER TABLE requests ADD COLUMN strategy TEXT;
"""
_SEARCH = """
        -- Full-text search over nodes (flowstate/store/search.py): each node's words as FlowState splits them, its
        -- id and summary (head) apart from its value (body), and the terms its filters narrow by (scope: its key
        -- namespace, kind, type); written with the node in its request's transaction, gone with its session. The
        -- migration indexes the nodes already stored.
"""

_BACKGROUND = """
        -- A background response (POST /v1/responses with background: true) is stored in progress when it starts and
        -- again when its turn ends. While it runs, the server running it renews its lease (unix seconds; NULL when no
        -- turn runs it): a lease no server renewed in time means the server stopped, and the response is failed.
        ALTER TABLE responses ADD COLUMN lease_at {id_type};
        CREATE INDEX responses_lease ON responses(lease_at) WHERE lease_at IS NOT NULL;
"""

_TENANTS = """
        -- Tenants own memory: a tenant's id is the namespace of its sessions (a key given with --api-key before
        -- tenants existed is adopted as the tenant "k" + the first 16 hex digits of its digest, the namespace its
        -- sessions always had). Keys prove who calls: only their SHA-256 digest is kept, never the secret.
        CREATE TABLE tenants (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            created_at {id_type} NOT NULL
        );
        CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(id),
            digest TEXT NOT NULL UNIQUE,
            created_at {id_type} NOT NULL,
            expires_at {id_type},
            revoked_at {id_type},
            replaces TEXT
        );
        CREATE INDEX api_keys_tenant ON api_keys(tenant_id);
"""

_KEY_USE = """
        -- What an operator sees of a key without its secret: a hint (a managed key's last four characters, fs-…WXYZ;
        -- none for a static key, whose secret an operator chose and may be short) and when it was last used (to the
        -- minute: a server writes it at most once a minute a key).
        ALTER TABLE api_keys ADD COLUMN hint TEXT;
        ALTER TABLE api_keys ADD COLUMN last_used_at {id_type};
"""

_USAGE_HOURS = """
        -- Each tenant's use over time, an hour a row (hour: unix seconds // 3600): requests that ended, the model
        -- tokens they spent and the requests its quota refused (429). What the console plots; never what was said.
        CREATE TABLE usage_hours (
            tenant_id TEXT NOT NULL,
            hour {id_type} NOT NULL,
            requests {id_type} NOT NULL DEFAULT 0,
            tokens {id_type} NOT NULL DEFAULT 0,
            refused {id_type} NOT NULL DEFAULT 0,
            PRIMARY KEY (tenant_id, hour)
        );
"""

_QUOTAS = """
        -- A tenant's limits (NULL: none), and what counts against them where every server sees it: requests per
        -- minute, running turns (each with a lease its server renews; a lapsed lease no longer counts) and model
        -- tokens per UTC day.
        ALTER TABLE tenants ADD COLUMN requests_per_minute INTEGER;
        ALTER TABLE tenants ADD COLUMN concurrent_turns INTEGER;
        ALTER TABLE tenants ADD COLUMN tokens_per_day {id_type};
        CREATE TABLE quota_minutes (
            tenant_id TEXT NOT NULL,
            minute {id_type} NOT NULL,
            requests INTEGER NOT NULL,
            PRIMARY KEY (tenant_id, minute)
        );
        CREATE TABLE quota_turns (
            id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL,
            lease_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX quota_turns_tenant ON quota_turns(tenant_id);
        CREATE TABLE quota_days (
            tenant_id TEXT NOT NULL,
            day {id_type} NOT NULL,
            tokens {id_type} NOT NULL,
            PRIMARY KEY (tenant_id, day)
        );
"""

_AUDIT = """
        -- The audit trail (flowstate/store/audit.py): every admin and data action, appended in the transaction of
        -- the action it records, never changed or removed (the triggers below refuse it).
        CREATE TABLE audit (
            id TEXT PRIMARY KEY,
            at DOUBLE PRECISION NOT NULL,
            tenant TEXT,
            key_id TEXT,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            result TEXT NOT NULL,
            detail TEXT NOT NULL
        );
        CREATE INDEX audit_tenant ON audit(tenant, id);
        CREATE INDEX audit_at ON audit(at);
"""

_AUDIT_CHAIN = """
        -- The audit trail's hash chain (flowstate/store/chain.py): one link an entry, in the order they committed.
        CREATE TABLE audit_chain (
            seq {seq} PRIMARY KEY,
            entry TEXT NOT NULL UNIQUE,
            scheme TEXT NOT NULL,
            digest TEXT NOT NULL
        );
"""

_RETENTION = """
        -- How long a tenant's memory is kept (flowstate/store/retention.py): a policy such as 'idle=30d,age=180d',
        -- 'off' (kept until deleted), or NULL (the server's --retention). A session stored before creation times
        -- were kept counts as created when this migration ran: retention never removes what it cannot date.
        ALTER TABLE tenants ADD COLUMN retention TEXT;
        UPDATE sessions SET created_at = {now} WHERE created_at IS NULL;
        CREATE INDEX sessions_created ON sessions(created_at);
        CREATE INDEX responses_created ON responses(created_at);
        CREATE INDEX conversations_created ON conversations(created_at);
"""

_ERASURES = """
        -- Erasure receipts (flowstate/store/erasure.py): what an erasure removed, counted per kind, with digests and
        -- never the erased content (the subject only salted and hashed), kept so the operator can show it later.
        CREATE TABLE erasures (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            receipt TEXT NOT NULL
        );
        CREATE INDEX erasures_tenant ON erasures(tenant, id);
"""

_VAULT = """
        -- The vault (flowstate/store/vault.py): each value redaction replaced, by session and placeholder, encrypted
        -- under a key the database never holds; gone with its session.
        CREATE TABLE vault (
            session TEXT NOT NULL,
            placeholder TEXT NOT NULL,
            kind TEXT NOT NULL,
            sealed TEXT NOT NULL,
            PRIMARY KEY (session, placeholder)
        );
        CREATE INDEX vault_placeholder ON vault(placeholder);
"""

_FEEDBACK = """
        -- Feedback on requests (flowstate/store/feedback.py): every piece kept, a key's latest counting; gone with its
        -- session, carried by its session file.
        CREATE TABLE feedback (
            id {seq},
            session TEXT NOT NULL,
            request INTEGER NOT NULL,
            key_id TEXT NOT NULL,
            score DOUBLE PRECISION,
            label TEXT,
            comment TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX feedback_session ON feedback(session, request);
"""
_RECORD_PARTS = """
        -- A run record's large repeated parts (the tools a request offered, the policy it ran under), once per
        -- session under their SHA-256 (flowstate/store/parts.py); the record names them; gone with its session.
        CREATE TABLE record_parts (
            session_id {id_type} NOT NULL REFERENCES sessions(id),
            digest TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, digest)
        );
"""

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_initial",
        _tables(key="INTEGER PRIMARY KEY", seq="INTEGER PRIMARY KEY AUTOINCREMENT", id_type="INTEGER")
        + """
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
        _FORGETTING
        + """
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
    ("0003_unfinished_requests", _UNFINISHED),
    (
        "0004_requests_in_order",
        _IN_ORDER
        + """
        CREATE TRIGGER requests_in_order BEFORE INSERT ON requests
            WHEN NEW.idx != COALESCE((SELECT MAX(idx) FROM requests WHERE session_id = NEW.session_id), 0) + 1
            BEGIN SELECT RAISE(ABORT, 'request index out of order'); END;
        """,
    ),
    ("0005_pending_requests", _PENDING),
    ("0006_transcripts", _TRANSCRIPTS.format(id_type="INTEGER")),
    (
        "0007_node_marks",
        _MARKS
        + """
        ALTER TABLE nodes ADD COLUMN mark TEXT;
        DROP TRIGGER nodes_no_update;
        UPDATE nodes SET mark = CASE
            WHEN node_id GLOB 'mage_s[0-9]*' THEN 'mage.summary'
            WHEN node_id GLOB 'mage_p[0-9]*' THEN 'mage.pointer'
            WHEN node_id GLOB 'mem_r[0-9]*_[0-9]*' THEN 'mem0.fact'
            WHEN node_id GLOB 'zipact_r[0-9]*' THEN 'zipact.state'
            WHEN node_id GLOB 'response_r[0-9]*' THEN 'no-isu.response'
        END WHERE kind = 'state';
        CREATE TRIGGER nodes_no_update BEFORE UPDATE ON nodes
            BEGIN SELECT RAISE(ABORT, 'historical nodes are immutable'); END;
        """,
    ),
    ("0008_responses", _RESPONSES.format(id_type="INTEGER")),
    (
        "0009_forks",
        _FORKS.format(id_type="INTEGER") + _RELATIONS_NO_TARGET_KEY
        + """
        DROP TRIGGER requests_in_order;
        CREATE TRIGGER requests_in_order BEFORE INSERT ON requests
            WHEN NEW.idx != COALESCE((SELECT MAX(idx) FROM requests WHERE session_id = NEW.session_id),
                                     (SELECT fork_at FROM sessions WHERE id = NEW.session_id)) + 1
            BEGIN SELECT RAISE(ABORT, 'request index out of order'); END;
        """,
    ),
    ("0010_activity", _ACTIVITY.format(id_type="INTEGER")),
    (
        "0011_search",
        _SEARCH + """
        CREATE VIRTUAL TABLE node_search USING fts5(head, body, scope, tokenize = 'unicode61 remove_diacritics 0');
        CREATE TRIGGER node_search_forget AFTER DELETE ON nodes
            BEGIN DELETE FROM node_search WHERE rowid = OLD.seq; END;
        """,
    ),
    ("0012_background", _BACKGROUND.format(id_type="INTEGER")),
    ("0013_tenants", _TENANTS.format(id_type="INTEGER")),
    ("0014_quotas", _QUOTAS.format(id_type="INTEGER")),
    ("0015_audit", _AUDIT + """
        CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
            BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
            BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
        """),
    ("0016_retention", _RETENTION.format(now="CAST(strftime('%s', 'now') AS INTEGER)")),
    ("0017_erasures", _ERASURES),
    ("0018_vault", _VAULT),
    ("0019_feedback", _FEEDBACK.format(seq="INTEGER PRIMARY KEY AUTOINCREMENT")),
    ("0020_record_parts", _RECORD_PARTS.format(id_type="INTEGER")),
    ("0021_audit_chain", _AUDIT_CHAIN.format(seq="INTEGER") + """
        CREATE TRIGGER audit_chain_no_update BEFORE UPDATE ON audit_chain
            BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
        CREATE TRIGGER audit_chain_no_delete BEFORE DELETE ON audit_chain
            BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
        -- INSERT OR REPLACE deletes the row it replaces without firing DELETE triggers (unless recursive_triggers
        -- is on, which the backend sets but a connection of someone else's need not): refuse the insert itself
        CREATE TRIGGER audit_no_replace BEFORE INSERT ON audit WHEN EXISTS (SELECT 1 FROM audit WHERE id = NEW.id)
            BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
        CREATE TRIGGER audit_chain_no_replace BEFORE INSERT ON audit_chain
            WHEN EXISTS (SELECT 1 FROM audit_chain WHERE seq = NEW.seq OR entry = NEW.entry)
            BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
        """),
    ("0022_key_use", _KEY_USE.format(id_type="INTEGER")),
    ("0023_usage_hours", _USAGE_HOURS.format(id_type="INTEGER")),
]


POSTGRES_MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_initial",
        _tables(key="BIGSERIAL PRIMARY KEY", seq="BIGSERIAL PRIMARY KEY", id_type="BIGINT")
        + """
        -- Historical nodes, their relations and finished requests are never changed or deleted.
        CREATE FUNCTION flowstate_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION '%', TG_ARGV[0]; END $$;
        CREATE TRIGGER nodes_immutable BEFORE UPDATE OR DELETE ON nodes
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('historical nodes are immutable');
        CREATE TRIGGER relations_immutable BEFORE UPDATE OR DELETE ON relations
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('historical relations are immutable');
        CREATE TRIGGER requests_no_update BEFORE UPDATE ON requests
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('finished requests are immutable');
        """,
    ),
    (
        "0002_forget_sessions",
        _FORGETTING
        + """
        DROP TRIGGER nodes_immutable ON nodes;
        DROP TRIGGER relations_immutable ON relations;
        CREATE FUNCTION flowstate_forgettable() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT forgetting FROM sessions WHERE id = OLD.session_id) IS DISTINCT FROM 1 THEN
                    RAISE EXCEPTION '%', TG_ARGV[0];
                END IF;
                RETURN OLD;
            END $$;
        CREATE TRIGGER nodes_no_update BEFORE UPDATE ON nodes
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('historical nodes are immutable');
        CREATE TRIGGER relations_no_update BEFORE UPDATE ON relations
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('historical relations are immutable');
        CREATE TRIGGER nodes_no_delete BEFORE DELETE ON nodes
            FOR EACH ROW EXECUTE FUNCTION flowstate_forgettable('historical nodes are immutable');
        CREATE TRIGGER relations_no_delete BEFORE DELETE ON relations
            FOR EACH ROW EXECUTE FUNCTION flowstate_forgettable('historical relations are immutable');
        CREATE TRIGGER requests_no_delete BEFORE DELETE ON requests
            FOR EACH ROW EXECUTE FUNCTION flowstate_forgettable('finished requests are immutable');
        """,
    ),
    ("0003_unfinished_requests", _UNFINISHED),
    (
        "0004_requests_in_order",
        _IN_ORDER
        + """
        CREATE FUNCTION flowstate_requests_in_order() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.idx != COALESCE((SELECT MAX(idx) FROM requests WHERE session_id = NEW.session_id), 0) + 1 THEN
                    RAISE EXCEPTION 'request index out of order';
                END IF;
                RETURN NEW;
            END $$;
        CREATE TRIGGER requests_in_order BEFORE INSERT ON requests
            FOR EACH ROW EXECUTE FUNCTION flowstate_requests_in_order();
        """,
    ),
    ("0005_pending_requests", _PENDING),
    ("0006_transcripts", _TRANSCRIPTS.format(id_type="BIGINT")),
    (
        "0007_node_marks",
        _MARKS
        + """
        ALTER TABLE nodes ADD COLUMN mark TEXT;
        DROP TRIGGER nodes_no_update ON nodes;
        UPDATE nodes SET mark = CASE
            WHEN node_id ~ '^mage_s[0-9]+$' THEN 'mage.summary'
            WHEN node_id ~ '^mage_p[0-9]+$' THEN 'mage.pointer'
            WHEN node_id ~ '^mem_r[0-9]+_[0-9]+$' THEN 'mem0.fact'
            WHEN node_id ~ '^zipact_r[0-9]+$' THEN 'zipact.state'
            WHEN node_id ~ '^response_r[0-9]+$' THEN 'no-isu.response'
        END WHERE kind = 'state';
        CREATE TRIGGER nodes_no_update BEFORE UPDATE ON nodes
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('historical nodes are immutable');
        """,
    ),
    ("0008_responses", _RESPONSES.format(id_type="BIGINT")),
    (
        "0009_forks",
        _FORKS.format(id_type="BIGINT")
        + """
        ALTER TABLE relations DROP CONSTRAINT relations_session_id_target_id_fkey;
        CREATE OR REPLACE FUNCTION flowstate_requests_in_order() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.idx != COALESCE((SELECT MAX(idx) FROM requests WHERE session_id = NEW.session_id),
                                       (SELECT fork_at FROM sessions WHERE id = NEW.session_id)) + 1 THEN
                    RAISE EXCEPTION 'request index out of order';
                END IF;
                RETURN NEW;
            END $$;
        """,
    ),
    ("0010_activity", _ACTIVITY.format(id_type="BIGINT")),
    (
        "0011_search",
        _SEARCH + """
        CREATE TABLE node_search (
            seq BIGINT PRIMARY KEY REFERENCES nodes(seq) ON DELETE CASCADE,
            doc tsvector NOT NULL
        );
        CREATE INDEX node_search_doc ON node_search USING GIN (doc);
        """,
    ),
    ("0012_background", _BACKGROUND.format(id_type="BIGINT")),
    ("0013_tenants", _TENANTS.format(id_type="BIGINT")),
    ("0014_quotas", _QUOTAS.format(id_type="BIGINT")),
    ("0015_audit", _AUDIT + """
        CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('the audit trail is append-only');
        """),
    ("0016_retention", _RETENTION.format(now="CAST(extract(epoch FROM now()) AS BIGINT)")),
    ("0017_erasures", _ERASURES),
    ("0018_vault", _VAULT),
    ("0019_feedback", _FEEDBACK.format(seq="BIGSERIAL PRIMARY KEY")),
    ("0020_record_parts", _RECORD_PARTS.format(id_type="BIGINT")),
    ("0021_audit_chain", _AUDIT_CHAIN.format(seq="BIGINT") + """
        CREATE TRIGGER audit_chain_append_only BEFORE UPDATE OR DELETE ON audit_chain
            FOR EACH ROW EXECUTE FUNCTION flowstate_immutable('the audit trail is append-only');
        -- TRUNCATE fires no row trigger: a statement trigger of its own on both tables
        CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
            FOR EACH STATEMENT EXECUTE FUNCTION flowstate_immutable('the audit trail is append-only');
        CREATE TRIGGER audit_chain_no_truncate BEFORE TRUNCATE ON audit_chain
            FOR EACH STATEMENT EXECUTE FUNCTION flowstate_immutable('the audit trail is append-only');
        """),
    ("0022_key_use", _KEY_USE.format(id_type="BIGINT")),
    ("0023_usage_hours", _USAGE_HOURS.format(id_type="BIGINT")),
]
FILLS: dict[str, Callable[[Any, bool], None]] = {"0011_search": search.fill, "0021_audit_chain": chain.fill}
"""Migrations whose data Python computes: run after the migration's SQL, in its transaction (conn, postgres)."""
MIGRATION_LOCK = 0x466C6F77  # the advisory lock that serializes migrations across processes


def apply_postgres(conn: Any) -> list[str]:
    """Apply the PostgreSQL migrations not yet recorded, in one transaction under an advisory lock, so
    that servers starting together migrate once; return their names."""
    applied: list[str] = []
    found = conn.execute("SELECT to_regclass('schema_migrations')").fetchone()
    if found is not None and found[0] is not None:  # all applied: nothing to write (a role that owns no table,
        done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}  # docs/tenants.md, opens it)
        if all(name in done for name, _ in POSTGRES_MIGRATIONS):
            return applied
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY)")
        done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
        for name, sql in POSTGRES_MIGRATIONS:
            if name in done:
                continue
            conn.execute(sql)
            if name in FILLS:
                FILLS[name](conn, True)
            conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (name,))
            applied.append(name)
    return applied


def apply_sqlite(conn: sqlite3.Connection) -> list[str]:
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
            if name in FILLS:
                FILLS[name](conn, False)
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
