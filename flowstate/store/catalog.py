"""A tenant's sessions as lists show them: a page of sessions, the most recently active first, and a page of the
states that match a search (``flowstate/store/search.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from flowstate.store import search as fts
from flowstate.store.backends import Backend
from flowstate.store.line import IN_LINE, LINE


@dataclass(frozen=True)
class SessionSummary:
    """A session as a list of sessions shows it: its size, when it was made and last finished a request, the memory
    method of its last request, and the session it was forked from (name, shared requests)."""

    name: str
    requests: int  # finished requests, a fork's shared ones included
    states: int  # the states it can read (a fork's shared ones included)
    created_at: int | None
    active_at: int  # 0 for a session that finished no request since activity was kept
    strategy: str | None
    forked_from: tuple[str, int] | None


class Catalog:
    """The pages of sessions and of search hits, each an index seek whatever the number of sessions."""

    def __init__(self, backend: Backend, shared: bool) -> None:
        self._db, self._shared = backend, shared

    def page(self, prefix: str, *, contains: str = "", limit: int = 100,
                     after: str | None = None) -> tuple[list[SessionSummary], bool]:
        """Sessions whose names start with ``prefix``, the most recently active first (then the newest), ``limit`` at
        a time from the one after the session named ``after``; with ``contains``, only names (past the prefix) that
        contain it, ignoring case. Whether more follow. An index seek a page, whatever the number of sessions."""
        where, args = "substr(s.name, 1, ?) = ?", [len(prefix), prefix]
        if contains:
            escaped = contains.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where += " AND lower(substr(s.name, ?)) LIKE ? ESCAPE '\\'"
            args += [len(prefix) + 1, f"%{escaped}%"]
        if after is not None:
            where += " AND (s.active_at, s.id) < (SELECT active_at, id FROM sessions WHERE name = ?)"
            args.append(after)
        sql = ("SELECT s.name, COALESCE((SELECT MAX(r.idx) FROM requests r WHERE r.session_id = s.id), s.fork_at),"
               " (SELECT COUNT(*) FROM nodes n WHERE n.session_id = s.id AND n.kind = 'state'), s.created_at,"
               " s.active_at, (SELECT r.strategy FROM requests r WHERE r.session_id = s.id ORDER BY r.idx DESC"
               " LIMIT 1), p.name, s.fork_at FROM sessions s LEFT JOIN sessions p ON p.id = s.parent_id"
               f" WHERE {where} ORDER BY s.active_at DESC, s.id DESC LIMIT ?")
        with self._db.read() as conn:
            rows = conn.execute(sql, [*args, limit + 1]).fetchall()
            out = []
            for name, requests, states, created, active, strategy, parent, at in rows[:limit]:
                if parent is not None:  # a fork reads its parent's states up to its point too
                    count = LINE + "SELECT COUNT(*) FROM nodes n " + IN_LINE + " WHERE n.kind = 'state'"
                    states = conn.execute(count, (name,)).fetchone()[0]
                out.append(SessionSummary(name, int(requests), int(states), None if created is None else int(created),
                                          int(active), strategy, None if parent is None else (parent, int(at))))
        return out, len(rows) > limit

    def search(self, namespace: str, search: fts.Search) -> tuple[list[fts.Hit], bool]:
        """One page of the states (and observations) of the namespace's sessions that match ``search``, best first,
        and whether more follow (``flowstate/store/search.py``)."""
        with self._db.read() as conn:
            return fts.run(conn, search, namespace, self._shared)
