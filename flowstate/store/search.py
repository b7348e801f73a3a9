"""Full-text search over a database's states (and, on request, raw observations): FTS5 on SQLite, PostgreSQL's
own full-text search, kept current by the writes that persist nodes.

Both databases index the same words: FlowState splits the text itself (runs of letters and digits, lower-cased;
JSON values by their keys and leaves), so SQLite's tokenizer and PostgreSQL's parser see only space-separated
words and a state matches on one exactly when it matches on the other. Each word of a query must be a word of the
state (id and summary, or value); the last word, as a user types it, may also begin one (three characters or more).
The filters a search takes (key namespace, kind, type) are terms of the index too. The newest ``RANK_WINDOW``
matches are ranked by each database's own ranking (FTS5's BM25, PostgreSQL's ``ts_rank``), with id and summary
weighted above the value; ties go to the newer state.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from flowstate.nodes import Node, StateType
from flowstate.store.line import LINE

MAX_QUERY_CHARS = 1000
MAX_QUERY_WORDS = 32
MAX_LIMIT = 100
PREFIX_FROM = 3  # the last query word, this long, also matches the words it begins ("hot" finds "hotel")
RANK_WINDOW = 2000  # a search ranks its newest this many matches (after its filters)
MAX_DOCUMENT_CHARS = 200_000  # of a node's words (a tool result can be large): the same cut on both databases
KINDS = {"states": "state", "observations": "observation"}
STATE_TYPES = tuple(t.value for t in StateType)

_WORD = re.compile(r"[^\W_]+")


class BadSearch(ValueError):
    """A search the caller must change (what is wrong is the message); never the database's fault."""


def words(text: str) -> list[str]:
    """The words search sees in a text: runs of letters and digits (any script), lower-cased."""
    return _WORD.findall(text.lower())


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    elif value is not None:
        yield str(value)


def _joined(parts: Sequence[str]) -> str:
    text = " ".join(w for p in parts for w in words(p))
    if len(text) <= MAX_DOCUMENT_CHARS:
        return text
    return text[:text.rfind(" ", 0, MAX_DOCUMENT_CHARS + 1)].rstrip()


def document(node_id: str, summary: str, value: Any) -> tuple[str, str]:
    """What the index holds of a node: its head (id and summary) and its body (the value's keys and leaves)."""
    return _joined([node_id, summary]), _joined(list(_leaves(value)))


def namespace_of(session: str) -> str:
    """The key namespace of a stored session name: what comes before its last '/' (names hold none of their own)."""
    return session[:session.rfind("/") + 1]


def _term(prefix: str, text: str) -> str:
    """A filter's term: names hashed (a word of letters and digits), kinds and types as they are."""
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:16] if prefix in "ns" else prefix + text


def scope(session: str, kind: str, type_: str) -> str:
    """The node's filter terms, indexed beside its words so that a search's filters narrow the index itself: its
    session's key namespace, its session, its kind and its type. No query word can be one: a query's words go to
    the head and body only."""
    return " ".join((_term("n", namespace_of(session)), _term("s", session), _term("k", kind), _term("t", type_)))


_DOC = "setweight(to_tsvector('simple', ?), 'A') || setweight(to_tsvector('simple', ?), 'B') || " \
       "setweight(to_tsvector('simple', ?), 'D')"


def index_sql(postgres: bool) -> str:
    """The statement that indexes one persisted node: (head, body, scope, session name, node id) a row."""
    where = " FROM nodes n WHERE n.session_id = (SELECT id FROM sessions WHERE name = ?) AND n.node_id = ?"
    if postgres:
        return f"INSERT INTO node_search (seq, doc) SELECT n.seq, {_DOC}" + where
    return "INSERT INTO node_search (rowid, head, body, scope) SELECT n.seq, ?, ?, ?" + where


def index_rows(session: str, nodes: Sequence[Node]) -> list[tuple[str, ...]]:
    return [(*document(n.id, n.summary, n.value), scope(session, n.kind, n.type.value), session, n.id) for n in nodes]


def fill(conn: Any, postgres: bool) -> None:
    """Index every node already stored (the migration that adds the index, for an existing database)."""
    rows = conn.execute("SELECT n.seq, n.node_id, n.summary, n.value, s.name, n.kind, n.type FROM nodes n"
                        " JOIN sessions s ON s.id = n.session_id ORDER BY n.seq").fetchall()
    batch = [(seq, *document(node_id, summary, json.loads(value)), scope(name, kind, type_))
             for seq, node_id, summary, value, name, kind, type_ in rows]
    if not batch:
        return
    if postgres:
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO node_search (seq, doc) VALUES (%s, {_DOC.replace('?', '%s')})", batch)
    else:
        conn.executemany("INSERT INTO node_search (rowid, head, body, scope) VALUES (?, ?, ?, ?)", batch)


@dataclass(frozen=True)
class Search:
    """One search, checked: its words, filters and page (``Search.parse`` builds it from what a caller sent)."""

    words: tuple[str, ...]
    kinds: tuple[str, ...] = ("state",)
    types: tuple[str, ...] = ()
    session: str | None = None  # the name within the caller's namespace
    since: int | None = None  # unix seconds, inclusive
    until: int | None = None  # unix seconds, inclusive
    limit: int = 20
    offset: int = 0

    @classmethod
    def parse(cls, q: str | None, *, type: str | None = None, session: str | None = None, since: str | None = None,
              until: str | None = None, limit: str | int | None = None, after: str | None = None,
              in_: str | None = None) -> Search:
        """A search from text parameters (HTTP query or command line); BadSearch says what is wrong."""
        if q is None or not q.strip():
            raise BadSearch("q is required: the words to search for")
        if len(q) > MAX_QUERY_CHARS:
            raise BadSearch(f"q is {len(q)} characters long: at most {MAX_QUERY_CHARS}")
        found = tuple(dict.fromkeys(words(q)))
        if not found:
            raise BadSearch(f"q {q[:60]!r} has no words to search for (letters or digits)")
        if len(found) > MAX_QUERY_WORDS:
            raise BadSearch(f"q has {len(found)} distinct words: at most {MAX_QUERY_WORDS}")
        kinds = tuple(dict.fromkeys(_kind(k) for k in _list(in_ or "states")))
        types = tuple(dict.fromkeys(_type(t) for t in _list(type or "")))
        search = cls(found, kinds, types, session or None, _moment(since, "since", end=False),
                     _moment(until, "until", end=True), _limit(limit))
        if search.since is not None and search.until is not None and search.since > search.until:
            raise BadSearch("since is after until")
        return replace(search, offset=search._offset(after)) if after else search

    def _digest(self) -> str:
        what = [self.words, self.kinds, self.types, self.session, self.since, self.until]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:12]

    def cursor(self, offset: int) -> str:
        """The ``after`` value of the page that starts at ``offset`` (it names this search's words and filters)."""
        raw = json.dumps([offset, self._digest()]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def _offset(self, after: str) -> int:
        try:
            offset, digest = json.loads(base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)))
        except (ValueError, TypeError, binascii.Error):
            raise BadSearch(f"after {after[:40]!r} is not a cursor this server gave") from None
        if not isinstance(offset, int) or offset < 0 or digest != self._digest():
            raise BadSearch("after is the cursor of another search: send the same q and filters it came with")
        return offset

    def match(self, postgres: bool, namespace: str, sessions: Sequence[str] = ()) -> str:
        """The database's query text: every word, the last one (of three or more characters) also as the start of a
        longer word — as a user types — and the filters' terms (the words are letters and digits only: nothing in
        them is the databases' query syntax). ``sessions``: the stored sessions a session filter reads."""
        last = len(self.words) - 1
        words = [(w, i == last and len(w) >= PREFIX_FROM) for i, w in enumerate(self.words)]
        scopes = [[_term("k", k) for k in self.kinds], [_term("t", t) for t in self.types]]
        if namespace:
            scopes.insert(0, [_term("n", namespace)])
        if sessions:
            scopes.insert(0, [_term("s", name) for name in sessions])
        if postgres:
            return " & ".join([self.ranked(), *(f"({' | '.join(g)})" for g in scopes if g)])
        text = "{head body} : (" + " AND ".join(f'"{w}"' + ("*" if p else "") for w, p in words) + ")"
        return " AND ".join([text, *(f"scope : ({' OR '.join(g)})" for g in scopes if g)])

    def ranked(self) -> str:
        """PostgreSQL's query of the words alone: what ``ts_rank`` scores (the filters' terms would score nothing)."""
        last = len(self.words) - 1
        return " & ".join(w + (":*" if i == last and len(w) >= PREFIX_FROM else "") for i, w in enumerate(self.words))


def _list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _kind(name: str) -> str:
    if name not in KINDS:
        raise BadSearch(f"in: unknown {name[:40]!r}; one or both of {', '.join(KINDS)}")
    return KINDS[name]


def _type(name: str) -> str:
    if name not in STATE_TYPES:
        raise BadSearch(f"type: unknown {name[:40]!r}; one or more of {', '.join(STATE_TYPES)}")
    return name


def _limit(limit: str | int | None) -> int:
    if limit is None or limit == "":
        return 20
    try:
        n = int(limit)
    except ValueError:
        raise BadSearch(f"limit {str(limit)[:40]!r} is not a number") from None
    if not 1 <= n <= MAX_LIMIT:
        raise BadSearch(f"limit is {n}: 1 to {MAX_LIMIT}")
    return n


def _moment(text: str | None, name: str, *, end: bool) -> int | None:
    """Unix seconds from unix seconds, an ISO 8601 date (a whole day: its start for since, its end for until) or
    date and time (UTC unless it says otherwise)."""
    if text is None or text == "":
        return None
    if text.isdigit():
        return int(text)
    try:
        day = date.fromisoformat(text)
        moment = datetime.combine(day + timedelta(days=1) if end else day, time(), UTC)
        return int(moment.timestamp()) - (1 if end else 0)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadSearch(f"{name} {text[:40]!r} is not a date: give an ISO 8601 date or time "
                        "(2026-12-03, 2026-12-03T10:00:00Z) or unix seconds") from None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


@dataclass(frozen=True)
class Hit:
    """A state (or observation) that matched: where it is and how well it matched."""

    session: str  # the full name in the repository
    request: int
    state_id: str
    kind: str
    type: str
    summary: str
    score: float
    created: int | None  # unix seconds its request was persisted (None before search existed)


def run(conn: Any, search: Search, namespace: str, postgres: bool) -> tuple[list[Hit], bool]:
    """One page of hits in the namespace's sessions (with ``search.session``, that session's lineage: a fork's
    shared states too), and whether there are more.

    The index alone finds and ranks (its filter terms narrow it; the newest ``RANK_WINDOW`` matches are ranked, so a
    word in every state costs no more than one in a few thousand); only the page's hits are read from the tables."""
    line = LINE
    args: list[Any] = []
    sql, sessions = "", []
    if search.session is not None:
        args = [namespace + search.session]
        sessions = [r[0] for r in conn.execute(line + "SELECT s.name FROM line l JOIN sessions s ON s.id = l.sid",
                                               args).fetchall()]
        if not sessions:
            return [], False
        sql = line
    if postgres:
        found = ("SELECT x.seq AS seq, ts_rank('{0, 0, 0.4, 1}', x.doc, w) AS score FROM node_search x"
                 " CROSS JOIN to_tsquery('simple', ?) q CROSS JOIN to_tsquery('simple', ?) w")
        args += [search.match(True, namespace, sessions), search.ranked()]
        where, newest = "x.doc @@ q", "x.seq"
    else:
        found = "SELECT x.rowid AS seq, -bm25(node_search, 4.0, 1.0, 0.0) AS score FROM node_search x"
        args.append(search.match(False, namespace, sessions))
        where, newest = "node_search MATCH ?", "x.rowid"  # FTS5 streams matches in this order
    if search.session is not None or search.since is not None or search.until is not None:
        found += " JOIN nodes fn ON fn.seq = x.seq" if postgres else " JOIN nodes fn ON fn.seq = x.rowid"
    if search.session is not None:
        found += " JOIN line l ON fn.session_id = l.sid AND fn.request_idx <= l.upto"
    if search.since is not None or search.until is not None:
        found += " JOIN requests fr ON fr.session_id = fn.session_id AND fr.idx = fn.request_idx"
    found += f" WHERE {where}"
    if search.since is not None:
        found += " AND fr.created_at >= ?"
        args.append(search.since)
    if search.until is not None:
        found += " AND fr.created_at <= ?"
        args.append(search.until)
    found += f" ORDER BY {newest} DESC LIMIT {RANK_WINDOW}"
    sql += (f"SELECT s.name, n.request_idx, n.node_id, n.kind, n.type, n.summary, p.score, r.created_at FROM"
            f" (SELECT seq, score FROM ({found}) w ORDER BY score DESC, seq DESC LIMIT ? OFFSET ?) p"
            " JOIN nodes n ON n.seq = p.seq JOIN sessions s ON s.id = n.session_id"
            " LEFT JOIN requests r ON r.session_id = n.session_id AND r.idx = n.request_idx"
            " WHERE substr(s.name, 1, ?) = ?"  # what the namespace's term found, exactly
            " ORDER BY p.score DESC, p.seq DESC")
    args += [search.limit + 1, search.offset, len(namespace), namespace]
    rows = (conn.once if postgres else conn.execute)(sql, args).fetchall()  # planned for its own words, every time
    hits = [Hit(r[0], int(r[1]), r[2], r[3], r[4], r[5], round(float(r[6]), 6), None if r[7] is None else int(r[7]))
            for r in rows[:search.limit]]
    return hits, len(rows) > search.limit
