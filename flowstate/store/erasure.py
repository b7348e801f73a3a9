"""Erasure: everything stored about a subject — a session name or an end-user id — within one namespace, removed in
one transaction, then scrubbed from the database's bytes as far as the database allows, with a receipt kept.

A subject names: the session of that name; every conversation whose metadata holds it as a value; every session a
stored response of the Responses API names as its ``user``; and every fork of those, forks first. Each goes whole
(``flowstate/store/forget.py``: requests, states, observations, relations, transcripts and their Idempotency-Keys,
search rows, its waiting request, its stored responses, its conversation). The receipt says what went, counted per
kind, and keeps no erased content: the subject only as a salted digest, and a digest over the receipt and the
removed rows' identifiers, so it can be shown later and checked by whoever holds the list.

Bytes (``scrub``): SQLite runs with ``secure_delete`` on (freed pages are overwritten with zeros), the full-text
index is merged (``optimize``: its old segments held the erased words) and the write-ahead log is checkpointed and
truncated, so the file holds no erased text. PostgreSQL keeps dead row versions until VACUUM, which ``scrub`` runs on
the affected tables; VACUUM does not zero the space it frees, a GIN index never drops a word until it is rebuilt, and
WAL segments, archives, replicas and backups hold their own copies: the receipt says so (``storage``), and
``scrub(full=True)`` (``flowstate erase --vacuum-full``) rewrites the tables and rebuilds the index.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flowstate.nodes import canonical_json
from flowstate.store import forget
from flowstate.store.audit import Entry, new_id, write
from flowstate.store.backends import Backend, Conn, PostgresBackend

TABLES = ("requests", "record_parts", "nodes", "relations", "transcripts", "responses", "conversations",
          "pending_requests", "feedback", "vault", "sessions")  # what an erasure deletes from (node_search too)
OUTSIDE = "exports and backups made before the erasure are outside the server: erase them where they are kept"
SQLITE_BYTES = ("sqlite: freed pages overwritten (secure_delete), the search index merged, the write-ahead log "
                "checkpointed and truncated: the database file holds no erased text (blocks the filesystem freed "
                "on truncation are outside SQLite's reach)")
PG_BYTES = ("postgresql: VACUUM ran on the affected tables: no query reaches the rows, but VACUUM does not zero the "
            "space it frees (the bytes stay until reused), the search index's GIN keys stay until it is rebuilt, and "
            "WAL segments, archives, replicas and base backups keep copies; `flowstate erase --vacuum-full` rewrites "
            "the tables and rebuilds the index (an exclusive lock while it runs)")


@dataclass(frozen=True)
class Receipt:
    """What an erasure removed, without what was removed."""

    id: str
    tenant: str | None
    subject_sha256: str  # sha256(salt + subject), hex
    salt: str
    at: float
    removed: dict[str, int]  # per kind: sessions, requests, states, observations, relations, transcripts,
    #                          idempotency_keys, responses, conversations, waiting_requests
    items_sha256: str  # sha256 over the sorted identifiers of what went (session names, response ids)
    digest: str  # sha256 over everything above: the receipt as kept
    storage: list[str] = field(default_factory=list)  # what the database's bytes still hold, and what is outside
    # what the erasure did not remove: the tenant's other sessions whose text names the subject (or its placeholders),
    # each with how many requests and states do — for the operator to review; None on a receipt made before it
    mentions: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"object": "erasure", **{k: v for k, v in asdict(self).items() if k != "mentions" or v is not None}}


def subject_digest(subject: str, salt: str) -> str:
    return hashlib.sha256((salt + subject).encode("utf-8", "surrogatepass")).hexdigest()


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class ErasureStore:
    def __init__(self, backend: Backend) -> None:
        self._db = backend
        self._shared = isinstance(backend, PostgresBackend)
        # what else names a subject as stored: its placeholders, when the repository redacts (Repository.redaction)
        self.aliases: Callable[[str, str], list[str]] = lambda namespace, subject: []

    def sessions_of(self, namespace: str, subject: str) -> list[str]:
        """The sessions (full names) the subject names in the namespace, forks before what they fork."""
        with self._db.read() as conn:
            return self._sessions(conn, namespace, subject)

    def _sessions(self, conn: Conn, namespace: str, subject: str) -> list[str]:
        roots = {namespace + subject}
        names = {subject, *self.aliases(namespace, subject)}
        for session, metadata in conn.execute("SELECT session, metadata FROM conversations WHERE substr(session, 1, ?)"
                                              " = ?", (len(namespace), namespace)):
            if "/" not in session[len(namespace):] and names & set(json.loads(metadata).values()):  # not a tenant's
                roots.add(session)
        for name in names:
            pattern = f'%"user":{_like(json.dumps(name, ensure_ascii=False))}%'
            for session, body in conn.execute("SELECT session, body FROM responses WHERE namespace = ? AND body LIKE ?"
                                              " ESCAPE '\\'", (namespace, pattern)):
                if json.loads(body).get("user") == name:
                    roots.add(session)
        marks = ", ".join("?" for _ in roots)
        tree = conn.execute(
            "WITH RECURSIVE tree(id, name, depth) AS (SELECT id, name, 0 FROM sessions WHERE name IN"
            f" ({marks}) UNION ALL SELECT s.id, s.name, t.depth + 1 FROM sessions s JOIN tree t ON s.parent_id = t.id)"
            " SELECT name, MAX(depth) FROM tree GROUP BY name", tuple(sorted(roots))).fetchall()
        depth = {name: int(d) for name, d in tree}
        return sorted(roots | set(depth), key=lambda n: (-depth.get(n, 0), n))

    def preview(self, namespace: str, subject: str) -> dict[str, Any]:
        """What ``erase`` would remove now, removing nothing: the sessions (names in the namespace) and the counts
        its receipt would give."""
        with self._db.read() as conn:
            sessions = self._sessions(conn, namespace, subject)
            counts, stored = self._count(conn, sessions)
            counts["responses"] = sum(conn.execute("SELECT COUNT(*) FROM responses WHERE session = ?",
                                                   (name,)).fetchone()[0] for name in sessions)
        counts["sessions"] = len(stored)
        return {"object": "erasure.preview", "sessions": [n[len(namespace):] for n in sessions if n in stored],
                "removed": counts}

    def erase(self, namespace: str, subject: str, actor: Entry | None = None) -> Receipt:
        """Remove everything the subject names in the namespace, in one transaction, with its receipt (and
        ``actor``'s audit entry, its target the subject's digest) kept in it."""
        tenant = namespace[:-1] or None
        with self._db.write(f"cannot erase subject in {namespace or 'the open namespace'}") as conn:
            sessions = self._sessions(conn, namespace, subject)
            counts, stored = self._count(conn, sessions)
            responses = sorted(r[0] for name in sessions for r in
                               conn.execute("SELECT id FROM responses WHERE session = ?", (name,)))
            counts["responses"] = len(responses)
            values = sorted({r[0] for name in sessions  # the placeholders of the values redaction took from them
                             for r in conn.execute("SELECT placeholder FROM vault WHERE session = ?", (name,))})
            gone = [name for name in sessions if forget.delete_session(conn, name, self._shared)]
            counts["sessions"] = sum(1 for name in gone if name in stored)
            counts["vault_values_elsewhere"] = self._unseal_elsewhere(conn, namespace, values)
            salt = secrets.token_hex(16)
            items = hashlib.sha256(canonical_json(sorted(gone) + responses).encode()).hexdigest()
            body: dict[str, Any] = {"id": new_id("era_"), "tenant": tenant,
                                    "subject_sha256": subject_digest(subject, salt), "salt": salt, "at": time.time(),
                                    "removed": counts, "items_sha256": items,
                                    "mentions": self._mentions(
                                        conn, namespace, [subject, *self.aliases(namespace, subject), *values])}
            receipt = Receipt(**body, digest=hashlib.sha256(canonical_json(body).encode()).hexdigest())
            conn.execute("INSERT INTO erasures (id, tenant, at, receipt) VALUES (?, ?, ?, ?)",
                         (receipt.id, tenant or "", receipt.at, canonical_json(asdict(receipt))))
            if actor is not None:
                write(conn, Entry("subject.erase", "sha256:" + receipt.subject_sha256[:16], actor.actor, actor.key,
                                  tenant, detail={"receipt": receipt.id, "removed": counts}))
        return receipt

    @staticmethod
    def _unseal_elsewhere(conn: Conn, namespace: str, placeholders: Sequence[str]) -> int:
        """The vault's copies of the subject's redacted values in the namespace's other sessions, deleted: the
        placeholder stays in their text, and no one can turn it back into the value. How many went."""
        removed = 0
        for placeholder in placeholders:
            for (session,) in conn.execute("SELECT session FROM vault WHERE placeholder = ? AND substr(session, 1, ?)"
                                           " = ?", (placeholder, len(namespace), namespace)).fetchall():
                if "/" not in session[len(namespace):]:  # the open namespace's own: never a tenant's
                    conn.execute("DELETE FROM vault WHERE session = ? AND placeholder = ?", (session, placeholder))
                    removed += 1
        return removed

    @staticmethod
    def _mentions(conn: Conn, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        """The namespace's sessions left whose queries, answers, state summaries or values hold one of ``names``
        (case-insensitive), with how many requests and nodes do: names only, never what they say."""
        found: dict[str, dict[str, int]] = {}
        for table, columns, kind in (("requests", ("query", "response"), "requests"),
                                     ("nodes", ("summary", "value"), "nodes")):
            for name in names:
                where = " OR ".join(f"lower(t.{c}) LIKE ? ESCAPE '\\'" for c in columns)
                like = f"%{_like(name.lower())}%"
                for session, n in conn.execute(
                        f"SELECT s.name, COUNT(*) FROM {table} t JOIN sessions s ON s.id = t.session_id"
                        f" WHERE substr(s.name, 1, ?) = ? AND ({where}) GROUP BY s.name",
                        (len(namespace), namespace, *[like] * len(columns))):
                    counts = found.setdefault(session, {"requests": 0, "nodes": 0})
                    counts[kind] = max(counts[kind], int(n))  # the most any one name is found in
        return [{"session": name[len(namespace):], **counts} for name, counts in sorted(found.items())
                if "/" not in name[len(namespace):]]  # the open namespace's own: never a tenant's

    @staticmethod
    def _count(conn: Conn, sessions: Sequence[str]) -> tuple[dict[str, int], set[str]]:
        """What the sessions own, counted per kind; which of them are stored sessions (not only a waiting request,
        a response or a conversation under that name)."""
        counts = dict.fromkeys(("requests", "states", "observations", "relations", "transcripts", "idempotency_keys",
                                "conversations", "waiting_requests"), 0)
        stored: set[str] = set()
        for name in sessions:
            row = conn.execute("SELECT id FROM sessions WHERE name = ?", (name,)).fetchone()
            counts["conversations"] += conn.execute("SELECT COUNT(*) FROM conversations WHERE session = ?",
                                                    (name,)).fetchone()[0]
            counts["waiting_requests"] += conn.execute("SELECT COUNT(*) FROM pending_requests WHERE name = ?",
                                                       (name,)).fetchone()[0]
            if row is None:
                continue
            stored.add(name)
            sid = int(row[0])
            counts["requests"] += conn.execute("SELECT COUNT(*) FROM requests WHERE session_id = ?",
                                               (sid,)).fetchone()[0]
            for kind, n in conn.execute("SELECT kind, COUNT(*) FROM nodes WHERE session_id = ? GROUP BY kind", (sid,)):
                counts["states" if kind == "state" else "observations"] += n
            counts["relations"] += conn.execute("SELECT COUNT(*) FROM relations WHERE session_id = ?",
                                                (sid,)).fetchone()[0]
            for (keys,) in conn.execute("SELECT idempotency FROM transcripts WHERE session_id = ?", (sid,)):
                counts["transcripts"] += 1
                counts["idempotency_keys"] += len(json.loads(keys))
        return {k: int(v) for k, v in counts.items()}, stored

    def scrub(self, full: bool = False) -> list[str]:
        """Take what the last erasures deleted out of the database's bytes as far as it allows; what remains."""
        if not self._shared:
            with self._db.write("cannot merge the search index") as conn:
                conn.execute("INSERT INTO node_search(node_search) VALUES ('optimize')")
            with self._db.read() as conn:
                for _ in range(50):
                    busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                    if not busy:
                        return [SQLITE_BYTES, OUTSIDE]
                    time.sleep(0.1)
            return [SQLITE_BYTES.split(":")[0] + ": the write-ahead log could not be truncated (another process "
                    "reads the database): erased rows may stay in it until its next checkpoint", OUTSIDE]
        with self._db.read() as conn:
            for table in (*TABLES, "node_search"):
                conn.execute(f"VACUUM {'FULL ' if full else ''}{table}")
            if full:
                conn.execute("REINDEX TABLE node_search")
        return [PG_BYTES if not full else PG_BYTES.split(":")[0] + ": VACUUM FULL rewrote the affected tables and "
                "REINDEX rebuilt the search index: no file of theirs holds the rows; WAL segments, archives, replicas "
                "and base backups keep copies", OUTSIDE]

    def receipt(self, receipt_id: str, tenant: str | None) -> Receipt | None:
        """A kept receipt, if it is the tenant's."""
        with self._db.read() as conn:
            row = conn.execute("SELECT receipt FROM erasures WHERE id = ? AND tenant = ?",
                               (receipt_id, tenant or "")).fetchone()
        return None if row is None else Receipt(**json.loads(row[0]))

    def keep_storage(self, receipt: Receipt, storage: list[str]) -> Receipt:
        """The receipt with what the bytes still hold (after ``scrub``), kept so."""
        kept = Receipt(**{**asdict(receipt), "storage": storage})
        with self._db.write("cannot keep the erasure receipt") as conn:
            conn.execute("UPDATE erasures SET receipt = ? WHERE id = ?", (canonical_json(asdict(kept)), receipt.id))
        return kept
