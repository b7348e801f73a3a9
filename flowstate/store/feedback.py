"""Feedback on a session's requests: a score in [-1, 1] or a label, and a comment, given per key. Every piece is
kept; a key's latest on a request is the one that counts (``latest``). It belongs to its session: it goes with it
(DELETE, retention, erasure: ``flowstate/store/forget.py``), travels in its session file, and selects the sessions an
evaluation replays (``flowstate eval --from … --feedback negative``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowstate.errors import SessionNotFound, StorageError
from flowstate.store.backends import Backend, Conn

MAX_COMMENT = 4000  # characters
MAX_LABEL = 64


class BadFeedback(StorageError):
    """Feedback that cannot be stored (what is wrong; nothing was stored)."""


@dataclass(frozen=True)
class Feedback:
    session: str
    request: int
    key: str  # the key (its id) that gave it; "" on a server without keys
    score: float | None
    label: str | None
    comment: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request, "key": self.key, "score": self.score, "label": self.label,
                "comment": self.comment, "at": self.at}


def check(score: Any, label: Any, comment: Any) -> tuple[float | None, str | None, str]:
    """A piece of feedback's fields, checked: a score in [-1, 1] or a label (or both), a comment of bounded size."""
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float)) or not -1 <= score <= 1):
        raise BadFeedback("score is a number from -1 to 1")
    if label is not None and (not isinstance(label, str) or not label.strip() or len(label) > MAX_LABEL):
        raise BadFeedback(f"label is a non-empty string of at most {MAX_LABEL} characters")
    if score is None and label is None:
        raise BadFeedback("feedback needs a score (from -1 to 1) or a label")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT:
        raise BadFeedback(f"comment is a string of at most {MAX_COMMENT} characters")
    return None if score is None else float(score), label, comment


def insert(conn: Conn, f: Feedback) -> None:
    conn.execute("INSERT INTO feedback (session, request, key_id, score, label, comment, at) VALUES (?, "
                 "?, ?, ?, ?, ?, ?)",
                 (f.session, f.request, f.key, f.score, f.label, f.comment, f.at))


class FeedbackStore:
    def __init__(self, backend: Backend) -> None:
        self._db = backend

    def give(self, f: Feedback) -> Feedback:
        """Store ``f`` (checked) on a finished request of its session."""
        check(f.score, f.label, f.comment)
        with self._db.write("cannot store feedback") as conn:
            row = conn.execute("SELECT id FROM sessions WHERE name = ?", (f.session,)).fetchone()
            if row is None:
                raise SessionNotFound(f.session)
            if not 1 <= f.request <= _requests(conn, f.session):
                raise BadFeedback(f"session {f.session!r} has no finished request {f.request}")
            insert(conn, f)
        return f

    def of(self, session: str, request: int | None = None) -> list[Feedback]:
        """Every piece given on the session's requests (or one request), oldest first."""
        where = "session = ?"
        args: list[Any] = [session]
        if request is not None:
            where += " AND request = ?"
            args.append(request)
        with self._db.read() as conn:
            rows = conn.execute("SELECT session, request, key_id, score, label, comment, at FROM feedback "
                                f"WHERE {where} ORDER BY at, id", args).fetchall()
        return [Feedback(r[0], int(r[1]), r[2], r[3], r[4], r[5], float(r[6])) for r in rows]

    def latest(self, session: str) -> dict[int, float]:
        """Per request, the mean of each key's latest score (labels alone carry none)."""
        return _scores(self.of(session))

    def by_session(self, prefix: str = "") -> dict[str, list[float]]:
        """Every session with scored feedback (names starting with ``prefix``): its requests' latest scores."""
        with self._db.read() as conn:
            rows = conn.execute("SELECT session, request, key_id, score, label, comment, at FROM feedback "
                                "WHERE substr(session, 1, ?) = ? ORDER BY at, id", (len(prefix), prefix)).fetchall()
        found: dict[str, list[Feedback]] = {}
        for r in rows:
            found.setdefault(r[0], []).append(Feedback(r[0], int(r[1]), r[2], r[3], r[4], r[5], float(r[6])))
        return {s: list(_scores(fs).values()) for s, fs in found.items() if _scores(fs)}


def _scores(pieces: list[Feedback]) -> dict[int, float]:
    latest: dict[tuple[int, str], float] = {}
    for f in pieces:  # oldest first: a key's later score replaces its earlier one
        if f.score is not None:
            latest[(f.request, f.key)] = f.score
    per: dict[int, list[float]] = {}
    for (request, _), score in latest.items():
        per.setdefault(request, []).append(score)
    return {r: round(sum(v) / len(v), 3) for r, v in sorted(per.items())}


def _requests(conn: Conn, session: str) -> int:
    """The session's finished requests, a fork's shared ones included."""
    row = conn.execute("SELECT s.fork_at, (SELECT MAX(r.idx) FROM requests r WHERE r.session_id = s.id) FROM sessions s"
                       " WHERE s.name = ?", (session,)).fetchone()
    return max(int(row[0] or 0), int(row[1] or 0)) if row else 0
