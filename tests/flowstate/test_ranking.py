"""Ranking by embeddings where a method's source embeds (``--embed``: mem0-style, reasoningbank): what the ranker
picks, that each text is embedded once, the report saying which ranking ran, and an embedder that fails."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.embeddings import Embedder, unit
from engine.errors import EngineUnavailable
from flowstate.eval.report import markdown, summarize
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.memory import EMBEDDING, embedded, get
from flowstate.memory.ranking import Embeddings, okapi
from flowstate.memory.reasoning import ReasoningBank
from flowstate.memory.retrieval import ExtractedMemory

SYNONYMS = {"teapot": "kettle", "kettles": "kettle", "plane": "flight", "flights": "flight"}
AXES = ("kettle", "flight", "hotel", "price")


class Concepts(Embedder):
    """A deterministic embedder for tests: a text's vector counts the concepts its words name (synonyms
    included, which BM25 cannot see); each call recorded."""

    label = "test:concepts"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        out = []
        for text in texts:
            words = [SYNONYMS.get(w, w) for w in text.lower().replace(",", " ").split()]
            out.append(unit([float(words.count(a)) + 1e-3 * (i + 1) for i, a in enumerate(AXES)]))
        return out


DOCS = ["a flight to Porto", "the hotel price list", "a blue kettle, boxed", "flights and a plane", "hotel", "kettles"]


def test_embeddings_rank_by_meaning_where_bm25_sees_no_shared_word() -> None:
    ranker = Embeddings(Concepts())
    assert ranker.top(DOCS, "my teapot", 2) == [2, 5]  # both kettles, though neither says "teapot" (a tie: older first)
    assert okapi(DOCS, "my teapot", 2) != [2, 5]  # BM25 shares no word with the query: its top two are others
    assert ranker.top([], "my teapot", 2) == [] and ranker.label == "test:concepts"


def test_each_text_is_embedded_once() -> None:
    concepts = Concepts()
    ranker = Embeddings(concepts)
    ranker.top(DOCS, "my teapot", 3)
    ranker.top(DOCS, "my teapot", 3)
    ranker.top(DOCS, "a plane", 3)
    assert concepts.calls == [[*DOCS, "my teapot"], ["a plane"]]


def test_only_the_methods_whose_sources_embed_take_an_embedder() -> None:
    concepts = Concepts()
    assert EMBEDDING == ("mem0-style", "reasoningbank")
    for name in EMBEDDING:
        method = embedded(get(name), concepts)
        assert isinstance(method, ExtractedMemory | ReasoningBank) and method.ranker is not None
        assert method.ranker.embedder is concepts and get(name).ranker is None  # the registered one is unchanged
    assert embedded(get("bm25"), concepts) is get("bm25") and embedded(get("flowstate"), concepts) is get("flowstate")
    mem0 = embedded(get("mem0-style"), concepts)
    assert isinstance(mem0, ExtractedMemory) and mem0.nearest(DOCS, "my teapot", 2) == [2, 5]  # stored order


def test_the_report_says_which_ranking_ran(tmp_path: Path) -> None:
    config = EvalConfig(suites=("hotel",), strategies=("reasoningbank", "mem0-style", "bm25"), tasks=1, depth=2,
                        out=tmp_path / "bm25", policy="oracle")
    text = markdown(summarize(run_eval(config, []), config))
    assert "reasoningbank and mem0-style: BM25 stands in for the embeddings their sources rank by (no --embed)." in text
    concepts = Concepts()
    config = EvalConfig(suites=("hotel",), strategies=("reasoningbank", "mem0-style"), tasks=1, depth=2,
                        out=tmp_path / "embedded", policy="oracle", embed=concepts.label)
    rows = run_eval(config, [], embedder=concepts)
    assert concepts.calls and all(s.correct is not None for r in rows for s in r.subtasks)
    text = markdown(summarize(rows, config))
    assert "reasoningbank and mem0-style rank by the embeddings of test:concepts, as their sources do." in text
    assert config.identity()["embed"] == "test:concepts"


class Down(Concepts):
    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise EngineUnavailable("embedding server down")


@pytest.mark.parametrize("name", EMBEDDING)
def test_an_embedder_that_fails_fails_the_request_and_the_evaluation_goes_on(tmp_path: Path, name: str) -> None:
    config = EvalConfig(suites=("hotel",), strategies=(name,), tasks=2, depth=2, out=tmp_path / "ev", policy="oracle",
                        embed="test:down")
    rows = run_eval(config, [], embedder=Down())
    assert len(rows) == 2  # both tasks ran to their end
    errors = [s.error or "" for r in rows for s in r.subtasks]
    assert any("embedding server down" in e for e in errors), errors


def test_kept_indexes_are_bounded_by_their_texts() -> None:
    """The indexes a server keeps for the sessions it ranks over: built once per texts, the least recently used
    dropped past the bound, one larger than the bound never kept."""
    from flowstate.memory.cache import IndexCache

    built: list[tuple[str, ...]] = []
    cache: IndexCache[int] = IndexCache(lambda texts: built.append(texts) or len(built), max_chars=10)
    a, b, c = ("aaaa",), ("bbbb",), ("cccc",)
    assert cache(a) == 1 and cache(a) == 1 and built == [a]  # once per texts
    cache(b)
    cache(a)  # a is now the most recently used
    cache(c)  # 12 characters > 10: b goes
    assert len(cache) == 2 and cache.chars == 8
    assert cache(a) == 1 and cache(b) == 4 and built == [a, b, c, b]
    cache(("x" * 11,))
    assert ("x" * 11,) not in cache._kept and cache.chars <= 10
