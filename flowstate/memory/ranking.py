"""How a memory method ranks documents against a query: BM25Okapi as MemoryArena's RAG memory ranks (``okapi``),
or by the cosine of their embeddings (``Embeddings``, where a method's source embeds: ReasoningBank, Mem0)."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from engine.embeddings import Embedder
from flowstate.memory.cache import IndexCache

BM25_TOP_K = 3  # MemoryArena's RAGMemorySystem(top_k=3)
CACHED = 8192  # texts whose vectors an embedding ranker keeps


def words(text: str) -> list[str]:
    """MemoryArena's BM25 tokens: lower-cased runs of ASCII letters and digits."""
    return re.findall(r"[a-z0-9]+", text.lower())


def okapi(documents: Sequence[str], query: str, k: int = BM25_TOP_K) -> list[int]:
    """The ``k`` documents BM25Okapi scores highest for ``query``, best first (ties: the older first), whatever
    their score; none when the query has no words."""
    terms = words(query)
    if not documents or not terms:
        return []
    scores = _okapi(tuple(documents)).get_scores(terms)
    return sorted(range(len(documents)), key=lambda i: -float(scores[i]))[:k]


def _build_okapi(documents: tuple[str, ...]) -> Any:
    from rank_bm25 import BM25Okapi

    return BM25Okapi([words(d) for d in documents])


_okapi: IndexCache[Any] = IndexCache(_build_okapi)


class Embeddings:
    """Documents ranked by the cosine of their embedding with the query's (each text embedded once, its
    vector kept): where a method's source embeds, with ``--embed``."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder, self.label = embedder, embedder.label
        self._vectors: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def top(self, documents: Sequence[str], query: str, k: int) -> list[int]:
        """The ``k`` documents nearest ``query``, best first (ties: the older first); raises ``EngineError``."""
        if not documents:
            return []
        vectors = self._embedded([*documents, query])
        q = vectors[-1]
        scores = [sum(a * b for a, b in zip(v, q, strict=True)) for v in vectors[:-1]]
        return sorted(range(len(documents)), key=lambda i: -scores[i])[:k]

    def _embedded(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            known = {t: self._vectors[t] for t in texts if t in self._vectors}
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:  # embedded outside the lock: other requests rank meanwhile
            known.update(zip(missing, self.embedder.embed(missing), strict=True))
        with self._lock:
            for t in dict.fromkeys(texts):
                self._vectors[t] = known[t]
                self._vectors.move_to_end(t)
            while len(self._vectors) > CACHED:
                self._vectors.popitem(last=False)
        return [known[t] for t in texts]
