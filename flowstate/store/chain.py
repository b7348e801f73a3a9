"""The audit trail's hash chain: each entry, as stored, is linked to the one before it by a digest over both, so that
an entry changed, removed or slipped in — by whoever holds the database owner's rights, past the triggers that refuse
it to the application — breaks the chain where it happened (``flowstate audit --verify``).

A link is ``sha256(previous digest, scheme, position, the entry's stored fields)``, or an HMAC-SHA256 of the same under
``$FLOWSTATE_AUDIT_KEY`` when the deployment sets one: without the key no one can compute a link, so a rewritten trail
cannot be chained again. Without a key, a chain rewritten whole from the first changed entry on still verifies; only a
head recorded elsewhere (``--expect SEQ:DIGEST``) shows it — as it shows entries cut off the end, which leave a
shorter chain intact. Links are appended one at a time (SQLite's one writer; on PostgreSQL an advisory lock held to
the end of the appending transaction), so positions are dense and in the order the entries committed."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowstate.errors import StorageError

# conn: a backend's Conn, db: its Backend (flowstate/store/backends.py, which imports the migrations, which import this)

KEY_ENV = "FLOWSTATE_AUDIT_KEY"
GENESIS = "0" * 64  # the digest before the first entry
LOCK = 0x41756474  # the advisory lock that serializes appends on PostgreSQL
FIELDS = "a.id, a.at, a.tenant, a.key_id, a.actor, a.action, a.target, a.result, a.detail"  # what a link covers
PAGE = 1000


def key() -> str:
    """``$FLOWSTATE_AUDIT_KEY`` ("" when unset); one shorter than 16 characters is refused, as no key at all."""
    given = os.environ.get(KEY_ENV, "")
    if given and len(given) < 16:
        raise ValueError(f"${KEY_ENV} is at least 16 characters (e.g. openssl rand -hex 32)")
    return given


def scheme(key: str) -> str:
    """``sha256`` without a key; ``hmac:`` and 8 hex digits of the key's own digest (never the key) with one."""
    return "hmac:" + hashlib.sha256(key.encode()).hexdigest()[:8] if key else "sha256"


def digest(prev: str, kind: str, seq: int, row: Sequence[Any], key: str) -> str:
    """The link of the entry ``row`` (its stored fields, in FIELDS' order) at position ``seq`` after ``prev``."""
    body = json.dumps([prev, kind, seq, *row], separators=(",", ":")).encode()
    if kind == "sha256":
        return hashlib.sha256(body).hexdigest()
    return hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def append(conn: Any, row: Sequence[Any]) -> None:
    """Link the entry ``row`` just inserted, in the caller's transaction (under ``$FLOWSTATE_AUDIT_KEY`` if set)."""
    if not isinstance(conn, sqlite3.Connection):  # PostgreSQL: one appender at a time, to the transaction's end
        conn.execute("SELECT pg_advisory_xact_lock(?)", (LOCK,))
    last = conn.execute("SELECT seq, digest FROM audit_chain ORDER BY seq DESC LIMIT 1").fetchone()
    seq, prev = (int(last[0]) + 1, last[1]) if last else (1, GENESIS)
    try:
        secret = key()
    except ValueError as exc:  # the action fails with its entry: nothing is done unrecorded
        raise StorageError(f"cannot chain the audit entry: {exc}") from None
    kind = scheme(secret)
    conn.execute("INSERT INTO audit_chain (seq, entry, scheme, digest) VALUES (?, ?, ?, ?)",
                 (seq, row[0], kind, digest(prev, kind, seq, row, secret)))


def fill(conn: Any, postgres: bool) -> None:
    """Chain the entries stored before the chain existed, in the order of their ids (the migration that adds it)."""
    rows = conn.execute(f"SELECT {FIELDS} FROM audit a ORDER BY a.id").fetchall()
    secret = key()
    kind, prev, links = scheme(secret), GENESIS, []
    for seq, row in enumerate(rows, 1):
        prev = digest(prev, kind, seq, row, secret)
        links.append((seq, row[0], kind, prev))
    if links:
        mark = "%s" if postgres else "?"
        sql = f"INSERT INTO audit_chain (seq, entry, scheme, digest) VALUES ({', '.join([mark] * 4)})"
        if postgres:
            with conn.cursor() as cur:
                cur.executemany(sql, links)
        else:
            conn.executemany(sql, links)


@dataclass
class ChainVerdict:
    """What ``verify`` found: the entries chained, the head (``SEQ:DIGEST``, to record elsewhere), the schemes the
    links use and each problem, the first of a kind with where it is."""

    entries: int = 0
    head: str = f"0:{GENESIS}"
    schemes: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.problems


def _links(db: Any) -> Iterator[tuple[Any, ...]]:
    """Every link with its entry's stored fields (None where the entry is gone), in order, a page at a time."""
    after = 0
    while True:
        with db.read() as conn:
            page = conn.execute(f"SELECT c.seq, c.scheme, c.digest, {FIELDS} FROM audit_chain c "
                                "LEFT JOIN audit a ON a.id = c.entry WHERE c.seq > ? ORDER BY c.seq LIMIT ?",
                                (after, PAGE)).fetchall()
        yield from page
        if len(page) < PAGE:
            return
        after = int(page[-1][0])


def verify(db: Any, secret: str = "", expect: str | None = None) -> ChainVerdict:
    """Walk the chain: every position in order, every entry present and as linked, no link weaker than one before
    it, no entry outside the chain; and, given ``expect`` (a head recorded earlier), that link still there."""
    found, prev, keyed, wanted = ChainVerdict(), GENESIS, False, scheme(secret)
    for seq, kind, link, *row in _links(db):
        found.schemes[kind] = found.schemes.get(kind, 0) + 1
        where = f"position {seq}"
        if seq != found.entries + 1:
            found.problems.append(f"{where}: follows position {found.entries} (links removed between)")
        elif row[0] is None:
            found.problems.append(f"{where}: its entry is gone")
        elif kind != "sha256" and kind != wanted:
            found.problems.append(f"{where}: keyed ({kind}) by " + ("a key not given" if not secret else "another key"))
        elif kind == "sha256" and keyed:
            found.problems.append(f"{where}: an unkeyed link after keyed ones (written without the key, or forged)")
        elif digest(prev, kind, seq, row, secret) != link:
            found.problems.append(f"{where} ({row[0]}): the entry or the chain before it was changed")
        keyed = keyed or kind != "sha256"
        found.entries, prev = int(seq), link
        if len(found.problems) >= 10:
            break
        if expect is not None and expect == f"{seq}:{link}":
            expect = None
    found.head = f"{found.entries}:{prev}"
    with db.read() as conn:
        loose = conn.execute("SELECT a.id FROM audit a LEFT JOIN audit_chain c ON c.entry = a.id "
                             "WHERE c.entry IS NULL ORDER BY a.id LIMIT 3").fetchall()
    found.problems += [f"entry {r[0]}: in no link (added outside FlowState)" for r in loose]
    if expect is not None:
        found.problems.append(f"the recorded head {expect} is not in the chain (rewritten, or cut off after it)")
    return found
