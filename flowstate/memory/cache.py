"""An index built from a tuple of texts (a session's memory entries), kept for the calls that rank over the same
texts: the most recently used indexes, while their texts total at most a bound — in a server, the sessions it
serves would otherwise hold indexes outside any memory budget."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")
MAX_CHARS = 64 << 20  # the texts behind the kept indexes, at most (an index is of the order of its texts)


class IndexCache(Generic[V]):
    """``build(texts)`` once per texts, kept least recently used first out past ``max_chars`` of texts (one index
    larger than the bound is built and not kept)."""

    def __init__(self, build: Callable[[tuple[str, ...]], V], max_chars: int = MAX_CHARS) -> None:
        self.build, self.max_chars = build, max_chars
        self._kept: OrderedDict[tuple[str, ...], tuple[V, int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __call__(self, texts: tuple[str, ...]) -> V:
        with self._lock:
            hit = self._kept.get(texts)
            if hit is not None:
                self._kept.move_to_end(texts)
                return hit[0]
        value, size = self.build(texts), sum(map(len, texts))
        with self._lock:
            if size <= self.max_chars and texts not in self._kept:
                self._kept[texts] = (value, size)
                self._chars += size
                while self._chars > self.max_chars:
                    _, (_, dropped) = self._kept.popitem(last=False)
                    self._chars -= dropped
        return value

    @property
    def chars(self) -> int:
        """The texts behind the kept indexes."""
        return self._chars

    def __len__(self) -> int:
        return len(self._kept)
