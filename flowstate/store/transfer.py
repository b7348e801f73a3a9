"""A portable session file: a database's sessions as JSON Lines, read back all or nothing (docs/operations.md).

The first line is a header (format, its version, the FlowState and schema versions that wrote it, when, the
sessions, how many lines of each kind follow, and the SHA-256 of the lines that follow); then one line per row the
repository holds — a session, its requests, nodes, relations, transcripts (with their idempotency replies), a
request waiting on tool results, a conversation, stored responses, feedback on its requests — each as canonical JSON, in
an order fixed by the rows (a session's requests by index, nodes as they were written), so that exporting what was
imported gives the same bytes on either database. Session names are relative to the namespace the file was exported from
and land in the one it is imported into. A fork whose parent is in the file stays a fork of it; one exported without its
parent carries the requests it shares as its own (it imports alone, as a session that is no fork).

Reading checks everything before writing anything: the header, the digest and counts, every line's fields and
types, that every row belongs to a session of the file, request indices in order, node ids unique, every relation's
target in its session's lineage, a fork's parent in the file; then, in one transaction, that no name or response id
is taken. A file that fails any check is refused by a ``BadSessionFile`` (or ``SessionExists``) naming what is wrong,
and the database is as it was.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.distribution import version as _version
from flowstate.errors import SessionNotFound, StorageError
from flowstate.nodes import Node, Ref, Relation, StateType, canonical_json, json_depth
from flowstate.store import feedback, parts
from flowstate.store import search as fts
from flowstate.store.audit import Entry
from flowstate.store.audit import write as write_audit
from flowstate.store.backends import Backend, Conn
from flowstate.store.line import LINE

FORMAT = "flowstate-session"
VERSION = 2  # of the format: a reader refuses a newer one by name, and reads each older one it lists in UPGRADES
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: lambda line: line,  # version 2 added feedback lines; a version 1 line is a version 2 line
}  # format version -> its line, as VERSION's
MAX_LINES = 250_000  # of a file's body: a larger one is refused before it is read
MAX_LINE_CHARS = 64 << 20  # one line (a node's value holds a whole tool result)
KINDS = ("session", "request", "node", "relation", "transcript", "pending", "conversation", "response", "feedback")
KINDS_OF = {1: KINDS[:-1], 2: KINDS}  # the line kinds a version's header counts


class BadSessionFile(StorageError):
    """A session file that cannot be imported: what is wrong, and where (nothing was written)."""


class SessionExists(StorageError):
    """An imported session's name is taken in the database (rename it on import)."""

    def __init__(self, names: list[str]) -> None:
        shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        super().__init__(f"the database already has session(s) {shown}: import with --rename OLD=NEW "
                         "(HTTP: ?rename=OLD=NEW), or delete them first")
        self.names = names


def _line(obj: dict[str, Any]) -> str:
    return canonical_json(obj) + "\n"


# -- export ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Stored:
    sid: int
    name: str  # full, as stored
    parent: int | None
    fork_at: int
    created_at: int | None
    active_at: int


def export_lines(conn: Conn, names: Sequence[str], namespace: str, schema: str) -> Iterator[str]:
    """The file of the sessions ``names`` (full names, each starting with ``namespace``), header first (a fork
    exported without its parent reads through its lineage, ``LINE``)."""
    wanted = _wanted(conn, names, namespace)
    names_of = {s.sid: s.name for s in wanted.values()}
    body: list[str] = []
    counts = dict.fromkeys(KINDS, 0)

    def emit(kind: str, **fields: Any) -> None:
        body.append(_line({"kind": kind, **fields}))
        counts[kind] += 1

    for s in sorted(wanted.values(), key=lambda s: s.sid):  # a parent was created before its forks
        rel = s.name[len(namespace):]
        keeps_parent = s.parent is not None and s.parent in wanted
        emit("session", name=rel, created_at=s.created_at, active_at=s.active_at,
             forked_from={"session": names_of[s.parent][len(namespace):], "requests": s.fork_at}
             if keeps_parent and s.parent is not None else None)
        _graph(conn, s, rel, LINE if s.parent is not None and not keeps_parent else "", emit)
        _beside(conn, s, rel, namespace, emit)
    digest = hashlib.sha256()
    for b in body:
        digest.update(b.encode())
    yield _line({"format": FORMAT, "version": VERSION, "flowstate": _version(), "schema": schema,
                 "exported_at": int(time.time()), "sessions": [s.name[len(namespace):] for s in
                                                               sorted(wanted.values(), key=lambda s: s.sid)],
                 "counts": counts, "digest": "sha256:" + digest.hexdigest()})
    yield from body


def _wanted(conn: Conn, names: Sequence[str], namespace: str) -> dict[int, _Stored]:
    wanted: dict[int, _Stored] = {}
    for name in names:
        row = conn.execute("SELECT id, name, parent_id, fork_at, created_at, active_at FROM sessions WHERE name = ?",
                           (name,)).fetchone()
        if row is None:
            raise SessionNotFound(f"unknown session {name[len(namespace):]!r}")
        wanted[int(row[0])] = _Stored(int(row[0]), row[1], row[2], int(row[3]), row[4], int(row[5]))
    return wanted


def _graph(conn: Conn, s: _Stored, rel: str, line: str, emit: Callable[..., None]) -> None:
    """A session's requests, nodes, relations and transcripts: its own rows, or (``line``, a fork without its parent
    in the file) its whole lineage's, as its own."""
    where = "JOIN line l ON {t}.session_id = l.sid AND {t}.{i} <= l.upto" if line else "WHERE {t}.session_id = ?"
    args: tuple[Any, ...] = (s.name,) if line else (s.sid,)

    def rows(sql: str, t: str, i: str, order: str) -> Any:
        return conn.execute(line + sql + " " + where.format(t=t, i=i) + " " + order, args)

    read: dict[tuple[int, str], Any] = {}  # the session's record parts, each read once
    for r in rows("SELECT r.idx, r.query, r.response, r.record, r.unfinished, r.created_at, r.strategy, r.session_id"
                  " FROM requests r", "r", "idx", "ORDER BY r.idx"):
        record = parts.whole(conn, json.loads(r[3]), int(r[7]), read)  # a file carries whole records
        if record.get("session") == s.name:
            record["session"] = rel
        emit("request", session=rel, index=int(r[0]), query=r[1], response=r[2], record=record,
             unfinished=r[4], created_at=r[5], strategy=r[6])
    nodes = list(rows("SELECT n.node_id, n.kind, n.type, n.summary, n.value, n.request_idx, n.mark, n.session_id"
                      " FROM nodes n", "n", "request_idx", "ORDER BY n.request_idx, n.seq"))
    for n in nodes:
        emit("node", session=rel, id=n[0], node_kind=n[1], type=n[2], summary=n[3], value=json.loads(n[4]),
             request=int(n[5]), mark=n[6])
    relations: dict[tuple[int, str], list[Any]] = {}
    for x in conn.execute(line + "SELECT x.session_id, x.source_id, x.position, x.rel, x.target_id FROM relations x"
                          " JOIN nodes n ON n.session_id = x.session_id AND n.node_id = x.source_id "
                          + where.format(t="n", i="request_idx") + " ORDER BY x.position", args):
        relations.setdefault((int(x[0]), x[1]), []).append(x)
    for n in nodes:
        for x in relations.get((int(n[7]), n[0]), []):
            emit("relation", session=rel, source=x[1], position=int(x[2]), rel=x[3], target=x[4])
    for t in rows("SELECT t.request_idx, t.messages, t.idempotency FROM transcripts t", "t", "request_idx",
                  "ORDER BY t.request_idx"):
        emit("transcript", session=rel, request=int(t[0]), messages=json.loads(t[1]), idempotency=json.loads(t[2]))


def _beside(conn: Conn, s: _Stored, rel: str, namespace: str, emit: Callable[..., None]) -> None:
    """What a session holds beside its graph: a waiting request, its conversation, its stored responses."""
    pending = conn.execute("SELECT request, snapshot FROM pending_requests WHERE name = ?", (s.name,)).fetchone()
    if pending is not None:
        snapshot = json.loads(pending[1])
        if snapshot.get("session") == s.name:
            snapshot["session"] = rel
        emit("pending", session=rel, request=int(pending[0]), snapshot=snapshot)
    conversation = conn.execute("SELECT metadata, created_at FROM conversations WHERE session = ?",
                                (s.name,)).fetchone()
    if conversation is not None:
        emit("conversation", session=rel, metadata=json.loads(conversation[0]), created_at=int(conversation[1]))
    for p in conn.execute("SELECT id, namespace, position, body, input_items, created_at FROM responses"
                          " WHERE session = ? ORDER BY created_at, id", (s.name,)):
        emit("response", session=rel, id=p[0], namespace=p[1][len(namespace):], position=int(p[2]),
             body=json.loads(p[3]), input_items=json.loads(p[4]), created_at=int(p[5]))
    for f in conn.execute("SELECT request, key_id, score, label, comment, at FROM feedback WHERE session = ?"
                          " ORDER BY at, id", (s.name,)):
        emit("feedback", session=rel, request=int(f[0]), key=f[1], score=f[2], label=f[3], comment=f[4], at=f[5])


def lines_of(text: str) -> list[str]:
    """A file's text as its lines, each with its newline (split at newlines only: a JSON string may hold U+2028)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


# -- reading a file ----------------------------------------------------------------------------------------------

def _opt(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return (*(kind if isinstance(kind, tuple) else (kind,)), type(None))


_ANY = object  # any JSON value
_FIELDS: dict[str, dict[str, Any]] = {
    "session": {"name": str, "created_at": _opt(int), "active_at": int, "forked_from": _opt(dict)},
    "request": {"session": str, "index": int, "query": str, "response": _opt(str), "record": dict,
                "unfinished": _opt(str), "created_at": _opt(int), "strategy": _opt(str)},
    "node": {"session": str, "id": str, "node_kind": str, "type": str, "summary": str, "value": _ANY, "request": int,
             "mark": _opt(str)},
    "relation": {"session": str, "source": str, "position": int, "rel": str, "target": str},
    "transcript": {"session": str, "request": int, "messages": list, "idempotency": dict},
    "pending": {"session": str, "request": int, "snapshot": dict},
    "conversation": {"session": str, "metadata": dict, "created_at": int},
    "response": {"session": str, "id": str, "namespace": str, "position": int, "body": dict, "input_items": list,
                 "created_at": int},
    "feedback": {"session": str, "request": int, "key": str, "score": _opt((int, float)), "label": _opt(str),
                 "comment": str, "at": (int, float)},
}
_RELATIONS = {r.value for r in Relation}
_TYPES = {t.value for t in StateType}


@dataclass
class _Session:
    name: str
    line: dict[str, Any]
    parent: str | None = None
    fork_at: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    relations: list[dict[str, Any]] = field(default_factory=list)
    transcripts: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None
    conversation: dict[str, Any] | None = None
    responses: list[dict[str, Any]] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SessionFile:
    """A checked file: its header and its sessions (renamed as asked), in the order they are to be written."""

    header: dict[str, Any]
    sessions: list[_Session]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sessions]


def renames(pairs: Iterable[str]) -> dict[str, str]:
    """``--rename`` / ``?rename=`` values (``OLD=NEW``) as a mapping; a ``ValueError`` names one that is not."""
    out: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ValueError(f"rename {pair[:60]!r}: give OLD=NEW")
        out[old] = new
    return out


def _where(number: int) -> str:
    return f"line {number}"


def _header(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        raise BadSessionFile("the file is empty: a session file begins with its header line")
    try:
        header = json.loads(text)
    except ValueError:
        raise BadSessionFile("line 1 is not JSON: a session file begins with its header line") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BadSessionFile(f"line 1 is not a FlowState session file's header (format {FORMAT!r})")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BadSessionFile("the header has no format version")
    if version > VERSION:
        raise BadSessionFile(f"format version {version} is newer than this FlowState reads ({VERSION}): "
                             "import it with the FlowState that wrote it, or a newer one")
    if version != VERSION and version not in UPGRADES:
        raise BadSessionFile(f"format version {version} is not one this FlowState reads (it reads {VERSION}"
                             + "".join(f", {v}" for v in sorted(UPGRADES)) + ")")
    counts, digest, kinds = header.get("counts"), header.get("digest"), KINDS_OF[version]
    if not isinstance(counts, dict) or set(counts) != set(kinds) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()):
        raise BadSessionFile(f"the header's counts must give a number of lines for each of {', '.join(kinds)}")
    header = {**header, "counts": {**dict.fromkeys(KINDS, 0), **counts}}  # as this version counts them
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise BadSessionFile("the header has no sha256 digest of the body")
    total = sum(counts.values())
    if total > MAX_LINES:
        raise BadSessionFile(f"the header counts {total:,} lines: a file holds at most {MAX_LINES:,}")
    return header


def _checked(obj: Any, number: int) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadSessionFile(f"{_where(number)} is not a JSON object")
    kind = obj.get("kind")
    if kind not in _FIELDS:
        raise BadSessionFile(f"{_where(number)}: unknown kind {str(kind)[:40]!r} (one of {', '.join(KINDS)})")
    spec = _FIELDS[kind]
    extra = sorted(set(obj) - set(spec) - {"kind"})
    missing = sorted(set(spec) - set(obj))
    if extra or missing:
        what = (f"unknown field(s) {', '.join(extra)}" if extra else "") + ("; " if extra and missing else "") + \
            (f"missing field(s) {', '.join(missing)}" if missing else "")
        raise BadSessionFile(f"{_where(number)} ({kind}): {what}")
    for name, want in spec.items():
        value = obj[name]
        wants = want if isinstance(want, tuple) else (want,)
        if want is not _ANY and (not isinstance(value, wants) or (isinstance(value, bool) and bool not in wants)):
            raise BadSessionFile(f"{_where(number)} ({kind}): {name} has the wrong type")
    return obj


def read_file(lines: Iterable[str], rename: Mapping[str, str] | None = None,
              max_depth: int | None = None) -> SessionFile:
    """Read and check a session file (its lines, newline-terminated) without touching a database; ``max_depth``: the
    deepest a line may nest (the endpoint's rule for every body it takes)."""
    rename = dict(rename or {})
    it = iter(lines)
    header = _header(next(it, None))
    digest = hashlib.sha256()
    counts = dict.fromkeys(KINDS, 0)
    sessions: dict[str, _Session] = {}
    number = 1
    for text in it:
        number += 1
        if number - 1 > sum(header["counts"].values()):
            raise BadSessionFile(f"{_where(number)}: the file has more lines than its header counts")
        if len(text) > MAX_LINE_CHARS:
            raise BadSessionFile(f"{_where(number)} is longer than {MAX_LINE_CHARS:,} characters")
        if not text.endswith("\n"):
            raise BadSessionFile(f"{_where(number)} has no newline: the file is truncated")
        digest.update(text.encode())
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            raise BadSessionFile(f"{_where(number)} is not JSON (or nests deeper than JSON may here)") from None
        if max_depth is not None and json_depth(obj) > max_depth:
            raise BadSessionFile(f"{_where(number)} nests {json_depth(obj)} levels deep: at most {max_depth}")
        if header["version"] != VERSION:
            obj = UPGRADES[header["version"]](obj)
        obj = _checked(obj, number)
        counts[obj["kind"]] += 1
        _place(obj, number, sessions, rename)
    if counts != header["counts"]:
        raise BadSessionFile(f"the file is truncated or edited: the header counts {header['counts']}, the body holds "
                             f"{counts}")
    if "sha256:" + digest.hexdigest() != header["digest"]:
        raise BadSessionFile("the body's sha256 is not the header's: the file was edited or damaged")
    unknown = sorted(set(rename) - {s.line["name"] for s in sessions.values()})
    if unknown:
        raise BadSessionFile(f"--rename names session(s) the file does not hold: {', '.join(unknown)}")
    for s in sessions.values():
        _check_session(s, sessions)
    return SessionFile(header, list(sessions.values()))


def _place(obj: dict[str, Any], number: int, sessions: dict[str, _Session], rename: Mapping[str, str]) -> None:
    """File one checked line under its session (the session's own line must come first)."""
    kind = obj["kind"]
    if kind == "session":
        name = rename.get(obj["name"], obj["name"])
        if not name or len(name) > 200:
            raise BadSessionFile(f"{_where(number)}: session name {name[:40]!r} is empty or longer than 200 characters")
        if name in sessions:
            raise BadSessionFile(f"{_where(number)}: session {name!r} appears twice")
        s = _Session(name, obj)
        fork = obj["forked_from"]
        if fork is not None:
            if set(fork) != {"session", "requests"} or not isinstance(fork["session"], str) or not isinstance(
                    fork["requests"], int) or isinstance(fork["requests"], bool) or fork["requests"] < 1:
                raise BadSessionFile(f"{_where(number)}: forked_from must be {{session, requests ≥ 1}}")
            parent = rename.get(fork["session"], fork["session"])
            if parent not in sessions:
                raise BadSessionFile(f"{_where(number)}: session {name!r} is a fork of {parent!r}, which the file does "
                                     "not hold before it (export the parent too, or the fork alone: it then carries "
                                     "what it shares)")
            s.parent, s.fork_at = parent, fork["requests"]
        sessions[name] = s
        return
    owner = rename.get(obj["session"], obj["session"])
    s_ = sessions.get(owner)
    if s_ is None:
        raise BadSessionFile(f"{_where(number)} ({kind}): session {owner!r} has no session line before it")
    obj = {**obj, "session": owner}
    if kind == "request":
        expected = s_.fork_at + len(s_.requests) + 1
        if obj["index"] != expected:
            raise BadSessionFile(f"{_where(number)}: request {obj['index']} of {owner!r} is out of order "
                                 f"(expected {expected})")
        s_.requests.append(obj)
    elif kind == "node":
        if obj["id"] in s_.nodes or not obj["id"]:
            raise BadSessionFile(f"{_where(number)}: node {obj['id']!r} of {owner!r} is empty or appears twice")
        if obj["node_kind"] not in ("state", "observation") or obj["type"] not in _TYPES:
            raise BadSessionFile(f"{_where(number)}: node {obj['id']!r} has an unknown kind or type")
        s_.nodes[obj["id"]] = obj
    elif kind == "relation":
        if obj["rel"] not in _RELATIONS:
            raise BadSessionFile(f"{_where(number)}: unknown relation {obj['rel'][:40]!r}")
        s_.relations.append(obj)
    elif kind == "transcript":
        s_.transcripts.append(obj)
    elif kind == "pending":
        if s_.pending is not None:
            raise BadSessionFile(f"{_where(number)}: session {owner!r} has two waiting requests")
        s_.pending = obj
    elif kind == "feedback":
        s_.feedback.append(_feedback(obj, number))
    elif kind == "conversation":
        if s_.conversation is not None:
            raise BadSessionFile(f"{_where(number)}: session {owner!r} has two conversation lines")
        s_.conversation = obj
    else:
        s_.responses.append(obj)


def _feedback(obj: dict[str, Any], number: int) -> dict[str, Any]:
    try:
        feedback.check(obj["score"], obj["label"], obj["comment"])
    except feedback.BadFeedback as exc:
        raise BadSessionFile(f"{_where(number)} (feedback): {exc}") from None
    if obj["request"] < 1:
        raise BadSessionFile(f"{_where(number)} (feedback): request {obj['request']} is not a request's index")
    return obj


def _check_session(s: _Session, sessions: Mapping[str, _Session]) -> None:
    """What a session's lines must say of each other (and of its parent's) before any is written."""
    indices = {r["index"] for r in s.requests}
    if s.parent is not None:
        parent = sessions[s.parent]
        have = parent.fork_at + len(parent.requests)
        if s.fork_at > have:
            raise BadSessionFile(f"session {s.name!r} shares {s.fork_at} requests of {s.parent!r}, which has {have}")
    for n in s.nodes.values():
        if n["request"] not in indices:
            raise BadSessionFile(f"node {n['id']!r} of {s.name!r} belongs to request {n['request']}, not one of the "
                                 "session's own")
    seen: set[tuple[str, int]] = set()
    for x in s.relations:
        if x["source"] not in s.nodes:
            raise BadSessionFile(f"a relation of {s.name!r} starts at {x['source']!r}, no node of the session")
        if (x["source"], x["position"]) in seen:
            raise BadSessionFile(f"relation {x['position']} of {x['source']!r} in {s.name!r} appears twice")
        seen.add((x["source"], x["position"]))
        if not _in_lineage(x["target"], s, sessions, upto=None):
            raise BadSessionFile(f"a relation of {x['source']!r} in {s.name!r} ends at {x['target']!r}, no node of "
                                 "the session or of what it shares")
    for t in s.transcripts:
        if t["request"] not in indices:
            raise BadSessionFile(f"a transcript of {s.name!r} is for request {t['request']}, not one of its own")
    if len({t["request"] for t in s.transcripts}) != len(s.transcripts):
        raise BadSessionFile(f"session {s.name!r} has two transcripts of one request")
    if s.pending is not None and s.pending["request"] != s.fork_at + len(s.requests) + 1:
        raise BadSessionFile(f"the waiting request of {s.name!r} is not its next one")


def _in_lineage(node_id: str, s: _Session, sessions: Mapping[str, _Session], upto: int | None) -> bool:
    node = s.nodes.get(node_id)
    if node is not None and (upto is None or node["request"] <= upto):
        return True
    if s.parent is None:
        return False
    return _in_lineage(node_id, sessions[s.parent], sessions, s.fork_at if upto is None else min(upto, s.fork_at))


# -- writing a file ----------------------------------------------------------------------------------------------

def write(conn: Conn, file: SessionFile, namespace: str, postgres: bool) -> None:
    """Write a checked file's sessions into ``namespace``, in the caller's transaction (which rolls back on error)."""
    full = {s.name: namespace + s.name for s in file.sessions}
    taken = [s.name for s in file.sessions if conn.execute(
        "SELECT 1 FROM sessions WHERE name = ? UNION ALL SELECT 1 FROM pending_requests WHERE name = ?"
        " UNION ALL SELECT 1 FROM conversations WHERE session = ? UNION ALL SELECT 1 FROM responses WHERE session = ?",
        (full[s.name],) * 4).fetchone() is not None]
    if taken:
        raise SessionExists(taken)
    ids = [r["id"] for s in file.sessions for r in s.responses]
    if len(set(ids)) != len(ids):
        raise BadSessionFile("a response id appears twice in the file")
    for rid in ids:
        if conn.execute("SELECT 1 FROM responses WHERE id = ?", (rid,)).fetchone() is not None:
            raise BadSessionFile(f"response {rid!r} already exists in this database (response ids are global): "
                                 "import into another database, or delete that response first")
    sid_of: dict[str, int] = {}
    for s in file.sessions:
        parent = None if s.parent is None else sid_of[s.parent]
        row = conn.execute("INSERT INTO sessions (name, parent_id, fork_at, created_at, active_at) "
                           "VALUES (?, ?, ?, ?, ?) RETURNING id",
                           (full[s.name], parent, s.fork_at, s.line["created_at"],
                                             s.line["active_at"])).fetchone()
        sid = sid_of[s.name] = int(row[0])
        _write_session(conn, s, sid, full[s.name], namespace, postgres)


def _write_session(conn: Conn, s: _Session, sid: int, name: str, namespace: str, postgres: bool) -> None:
    original = s.line["name"]
    for r in s.requests:
        record = dict(r["record"])
        if record.get("session") == original:
            record["session"] = name
        conn.execute("INSERT INTO requests (session_id, idx, query, response, record, unfinished, created_at, strategy)"
                     " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (sid, r["index"], r["query"], r["response"],
                                                          canonical_json(parts.lean(conn, record, "?", (sid,))),
                                                          r["unfinished"], r["created_at"], r["strategy"]))
    refs: dict[str, list[Ref]] = {}
    for x in sorted(s.relations, key=lambda x: (x["source"], x["position"])):
        refs.setdefault(x["source"], []).append(Ref(rel=Relation(x["rel"]), state_id=x["target"]))
    nodes = [Node(id=n["id"], kind=n["node_kind"], type=StateType(n["type"]), summary=n["summary"], value=n["value"],
                  refs=tuple(refs.get(n["id"], ())), request=n["request"], mark=n["mark"]) for n in s.nodes.values()]
    if nodes:
        conn.executemany("INSERT INTO nodes (session_id, node_id, kind, type, summary, value, request_idx, mark)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         [(sid, n.id, n.kind, n.type.value, n.summary, canonical_json(n.value), n.request, n.mark)
                          for n in nodes])
        conn.executemany(fts.index_sql(postgres), fts.index_rows(name, nodes))
    if s.relations:
        conn.executemany("INSERT INTO relations (session_id, source_id, position, rel, target_id) "
                         "VALUES (?, ?, ?, ?, ?)",
                         [(sid, x["source"], x["position"], x["rel"], x["target"]) for x in s.relations])
    for t in s.transcripts:
        conn.execute("INSERT INTO transcripts (session_id, request_idx, messages, idempotency) VALUES (?, ?, ?, ?)",
                     (sid, t["request"], canonical_json(t["messages"]), canonical_json(t["idempotency"])))
    if s.pending is not None:
        snapshot = dict(s.pending["snapshot"])
        if snapshot.get("session") == original:
            snapshot["session"] = name
        conn.execute("INSERT INTO pending_requests (name, request, snapshot) VALUES (?, ?, ?)",
                     (name, s.pending["request"], canonical_json(snapshot)))
    if s.conversation is not None:
        conn.execute("INSERT INTO conversations (session, metadata, created_at) VALUES (?, ?, ?)",
                     (name, canonical_json(s.conversation["metadata"]), s.conversation["created_at"]))
    for f in s.feedback:
        feedback.insert(conn, feedback.Feedback(name, f["request"], f["key"], f["score"], f["label"], f["comment"],
                                                f["at"]))
    for p in s.responses:
        body = dict(p["body"])
        if s.name != original and isinstance(body.get("conversation"), dict) and \
                body["conversation"].get("id") == original:
            body["conversation"] = {**body["conversation"], "id": s.name}
        # a background response exported while it ran: no server runs it here, so its lease has run out (the next
        # lease check fails it)
        running = body.get("status") in ("queued", "in_progress")
        conn.execute("INSERT INTO responses (id, namespace, session, position, body, input_items, created_at, "
                     "lease_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (p["id"], namespace + p["namespace"], name, p["position"], canonical_json(body),
                      canonical_json(p["input_items"]), p["created_at"], 0 if running else None))


class Transfer:
    """Session files out of the repository and into it (the module above: what a file holds and how it is checked)."""

    def __init__(self, backend: Backend, shared: bool) -> None:
        self._db, self._shared = backend, shared

    def export(self, names: Sequence[str], namespace: str = "") -> list[str]:
        """The session file (its lines) of the sessions ``names`` (full names, in ``namespace``), read at one point."""
        from flowstate.store.migrations import MIGRATIONS

        with self._db.read() as conn:
            return list(export_lines(conn, names, namespace, MIGRATIONS[-1][0]))

    def load(self, lines: Iterable[str], namespace: str = "", rename: Mapping[str, str] | None = None) -> list[str]:
        """Import a session file into ``namespace``, all or nothing; the names of the sessions made. A bad file is a
        ``BadSessionFile``, a taken name a ``SessionExists``, and then nothing is written."""
        file = read_file(lines, rename)
        self.write(file, namespace)
        return file.names

    def write(self, file: SessionFile, namespace: str = "", audit: Entry | None = None) -> None:
        """Write a checked session file's sessions into ``namespace`` in one transaction (a taken name or response
        id refuses it whole), ``audit`` recorded in it."""
        with self._db.write("cannot import the session file") as conn:
            write(conn, file, namespace, self._shared)
            if audit is not None:
                write_audit(conn, audit)
