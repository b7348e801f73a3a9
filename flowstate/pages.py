"""The bounded Historical State Index: older requests folded into pages, so the index stays under a budget.

The paper's index G_k has one line per earlier request and grows without bound (a session of thousands of
requests no longer fits a context). With a budget, the oldest requests are folded into pages: a page is one
index line — its id, the requests it covers and a summary (the words its requests' queries and state
summaries use most, then their ids and codes) — and its requests' own lines are disclosed on demand through PSA, under
the same access rules: a page id in the index is admissible, and once a page is disclosed the ids its lines list are
too. A page of ``FANOUT`` requests is a level-1 page; ``FANOUT`` level-1 pages fold into a level-2 page, and
so on, so any number of requests fits a fixed budget while nothing becomes unreachable.

Folding is deterministic and only ever grows from the oldest end: the page lines come first and never change
once made, so the rendering keeps a stable prefix across requests (a new page costs one cache miss at its
line). A page's summary is at most ``SUMMARY_CHARS`` characters. The budget counts estimated tokens (UTF-8 bytes / 3, an
over-estimate for BPE vocabularies on JSON and English), or a given counter's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from flowstate.history import HistoricalIndex, IndexEntry
from flowstate.nodes import PAGE_PREFIX, Node, StateType, canonical_json

FANOUT = 16
"""Requests per level-1 page, and pages per page of the level above."""

PAGE_MARK = "index.page"
"""The mark of a page's node: made by the runtime from the index, never persisted, never written by a model."""


TOPIC_WORDS = 6
SUMMARY_CHARS = 240
_STOP = frozenset("the and for with from that this what your you are was can will have has not but all any its "
                  "into out about please then them they their there when which who how our use used".split())


def estimate(text: str) -> int:
    """Tokens, estimated: UTF-8 bytes / 3 (BPE vocabularies average more bytes per token on JSON and English)."""
    return -(-len(text.encode("utf-8")) // 3)


@dataclass(frozen=True)
class Page:
    """Requests ``first``..``last`` of the session, folded: ``units`` are their index lines (level 1) or the
    pages of the level below."""

    level: int
    first: int
    last: int
    units: tuple[IndexEntry | Page, ...]

    @property
    def id(self) -> str:
        return f"{PAGE_PREFIX}r{self.first}_{self.last}"

    def entries(self) -> list[IndexEntry]:
        return [e for u in self.units for e in (u.entries() if isinstance(u, Page) else [u])]

    def listed(self) -> frozenset[str]:
        """The ids its lines show: the states of its requests, or its pages."""
        return shown(self.units)

    def summary(self) -> str:
        return self._summary

    @cached_property
    def _summary(self) -> str:
        """What its requests are about, up to ``SUMMARY_CHARS``: the content words their queries and state
        summaries use most, then their distinctive names (words with a digit or an underscore: ids, days, codes)
        in order — what a later request looks for."""
        counts: Counter[str] = Counter()
        names: dict[str, None] = {}
        for e in self.entries():
            words = _words(" ".join([e.user_query, *(s for _, s in e.states)]))
            counts.update(w for w in words if not _named(w))
            names.update(dict.fromkeys(w for w in words if _named(w)))
        out = ""
        for word in [*(w for w, _ in counts.most_common(TOPIC_WORDS)), *names]:
            if len(out) + len(word) + 1 > SUMMARY_CHARS:
                break
            out = f"{out} {word}" if out else word
        return out

    def as_dict(self) -> dict[str, object]:
        return {"page_id": self.id, "requests": [self.first, self.last], "summary": self.summary(),
                "states": sum(len(e.states) for e in self.entries())}

    def render(self) -> str:
        return canonical_json(self.as_dict())

    def node(self) -> Node:
        """What PSA discloses of it: its lines, as the index would show them."""
        return Node(id=self.id, mark=PAGE_MARK, type=StateType.KNOWLEDGE, summary=self.summary(),
                    value={"index": [u.as_dict() for u in self.units], "listed": sorted(self.listed())},
                    request=self.last)


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9][a-z0-9_-]*[a-z0-9]", text.lower()) if len(w) > 2 and w not in _STOP]


def _named(word: str) -> bool:
    return any(c.isdigit() or c == "_" for c in word)


@dataclass(frozen=True)
class BoundedIndex(HistoricalIndex):
    """G_k with its oldest requests folded into pages (``units``: pages, then the latest requests' lines)."""

    units: tuple[IndexEntry | Page, ...] = ()

    def ids(self) -> frozenset[str]:
        """What the index shows: the recent requests' states and the pages."""
        return shown(self.units)

    def render(self) -> str:
        return "".join(u.render() + "\n" for u in self.units)

    def pages(self) -> tuple[Node, ...]:
        """Every page at every level, as nodes PSA can disclose."""
        out: list[Node] = []

        def walk(units: Sequence[IndexEntry | Page]) -> None:
            for u in units:
                if isinstance(u, Page):
                    out.append(u.node())
                    walk(u.units)

        walk(self.units)
        return tuple(out)


def shown(units: Sequence[IndexEntry | Page]) -> frozenset[str]:
    """The ids a row of index lines shows: each request's states, and each page's own id."""
    return frozenset(i for u in units for i in ((u.id,) if isinstance(u, Page) else (s for s, _ in u.states)))


def _level(unit: IndexEntry | Page) -> int:
    return unit.level if isinstance(unit, Page) else 0


def _first(unit: IndexEntry | Page) -> int:
    return unit.first if isinstance(unit, Page) else unit.query_id


def fold(index: HistoricalIndex, budget: int, count: Callable[[str], int] = estimate) -> BoundedIndex:
    """``index`` with its oldest requests folded into pages until its rendering fits ``budget`` tokens.

    Each fold merges the oldest ``FANOUT`` consecutive units of one level whose first request starts a page
    of the level above; when none is left to merge, the index stays as folded as it can be (over budget).
    """

    @lru_cache(maxsize=None)
    def cost(line: str) -> int:
        return count(line + "\n")

    units: list[IndexEntry | Page] = list(index.entries)
    total = sum(cost(u.render()) for u in units)
    while total > budget:
        at = _mergeable(units)
        if at is None:
            break
        group = units[at: at + FANOUT]
        last = group[-1].last if isinstance(group[-1], Page) else group[-1].query_id
        page = Page(_level(group[0]) + 1, _first(group[0]), last, tuple(group))
        total += cost(page.render()) - sum(cost(u.render()) for u in group)
        units[at: at + FANOUT] = [page]
    return BoundedIndex(index.entries, tuple(units))


def _mergeable(units: Sequence[IndexEntry | Page]) -> int | None:
    """The position of the oldest run of ``FANOUT`` units of one level that starts a page of the level above."""
    for i in range(len(units) - FANOUT + 1):
        level = _level(units[i])
        span = FANOUT ** (level + 1)
        run = units[i: i + FANOUT]
        if (_first(units[i]) - 1) % span == 0 and all(_level(u) == level for u in run) \
                and _first(run[-1]) == _first(units[i]) + (FANOUT - 1) * FANOUT ** level:
            return i
    return None
