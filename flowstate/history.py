"""The Historical State Index G_k = Index(M_k): per earlier request, its query and (state_id, summary) pairs.

Rendered one JSON line per request, so the rendering of G_k is a byte prefix of G_{k+1}'s:
earlier entries never change (historical nodes are immutable), new requests append a line.
Raw tool observations are not listed; they are reached through the relations of disclosed states.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowstate.nodes import Node, canonical_json
from flowstate.store.repository import Repository, RequestRow

STOPWORDS = frozenset("a an and are as at be but by can do for from have i if in is it me my no not of on or please "
                      "so that the this to was we what with you your yes ok okay".split())


IDENT = re.compile(r"(?=.*\d)[A-Za-z0-9][A-Za-z0-9_-]{3,}")
"""An identifier in a result: a token with a digit (ids, flight numbers, payment ids, dates), no spaces."""


def scalars(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, scalar) for every scalar in a JSON value."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in scalars(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in scalars(v, f"{path}[{i}]")]
    return [(path or "value", value)] if value is not None else []


def identifiers(value: Any) -> list[str]:
    """The identifiers (``IDENT``) among a JSON value's strings, each once, in order: what an index line names so
    that a later request finds the state that holds one."""
    return list(dict.fromkeys(v for _, v in scalars(value) if isinstance(v, str) and IDENT.fullmatch(v)))


def words(text: str) -> set[str]:
    """The content words of a text (lowercase, no stopwords, longer than one character): what a lookup of the
    index by a query's words matches on (lean's disclosure, the reference policies' requests for states)."""
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS and len(w) > 1}


@dataclass(frozen=True)
class IndexEntry:
    query_id: int
    user_query: str
    states: tuple[tuple[str, str], ...]  # (state_id, summary) in creation order
    unfinished: str | None = None  # why the request ended without a response, if it did

    def as_dict(self) -> dict[str, object]:
        states = [{"state_id": sid, "summary": summary} for sid, summary in self.states]
        entry: dict[str, object] = {"query_id": self.query_id, "states": states, "user_query": self.user_query}
        if self.unfinished is not None:
            entry["unfinished"] = self.unfinished
        return entry

    def render(self) -> str:
        return canonical_json(self.as_dict())


@dataclass(frozen=True)
class HistoricalIndex:
    entries: tuple[IndexEntry, ...] = ()

    def ids(self) -> frozenset[str]:
        return frozenset(sid for e in self.entries for sid, _ in e.states)

    def render(self) -> str:
        """One line per earlier request, each ending in a newline; empty for the first request."""
        return "".join(e.render() + "\n" for e in self.entries)


def build_index(requests: Sequence[RequestRow], nodes: Sequence[Node]) -> HistoricalIndex:
    """Index(M_k): every persisted request with the states it created (nodes in creation order); a request
    that ended without a response is marked unfinished, with the reason."""
    states: dict[int, list[tuple[str, str]]] = {}
    for node in nodes:
        if not node.is_observation:
            states.setdefault(node.request, []).append((node.id, node.summary))
    return HistoricalIndex(tuple(
        IndexEntry(r.index, r.query, tuple(states.get(r.index, ())), r.unfinished) for r in requests
    ))


def session_index(repo: Repository, session: str) -> HistoricalIndex:
    """G_k of ``session`` as stored in ``repo``."""
    return build_index(repo.requests(session), repo.nodes(session))
