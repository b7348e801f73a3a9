"""Drafting from the prompt (``engine/lookup.py``): the drafts, and the rule that keeps them — under greedy decoding
exactly the verifier's own argmax at each position, under sampling each token's distribution the model's own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EngineConfigError
from engine.lookup import Lookup, Speculation, greedy, sampler, verify


@pytest.mark.parametrize(("spec", "k"), [("lookup:4", 4), ("lookup:1", 1), ("lookup:32", 32)])
def test_a_speculation_is_lookup_k(spec: str, k: int) -> None:
    assert Speculation.parse(spec) == Speculation(k)
    assert str(Speculation.parse(spec)) == spec


def test_a_speculation_names_its_method_and_ngram_bounds_for_the_engines_that_take_them() -> None:
    both = ("ngram", "suffix")
    assert Speculation.parse("ngram:5:2-4", both) == Speculation(5, max_ngram=4, min_ngram=2, method="ngram")
    assert Speculation.parse("ngram:5:2-4", both).vllm_config() == {  # type: ignore[union-attr]
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert Speculation.parse("suffix:8", both).vllm_config() == {"method": "suffix", "num_speculative_tokens": 8}  # type: ignore[union-attr]
    assert str(Speculation.parse("ngram:5:2-4", both)) == "ngram:5:2-4"
    with pytest.raises(EngineConfigError, match="speculate takes ngram:K.*or suffix:K"):
        Speculation.parse("lookup:4", both)  # the engine names what it takes


@pytest.mark.parametrize("spec", ["ngram:4", "lookup", "lookup:0", "lookup:33", "lookup:x", "eagle:3",
                                  "lookup:4:3-2", "lookup:4:0-2", "lookup:4:2"])
def test_a_bad_speculation_says_what_it_takes(spec: str) -> None:
    with pytest.raises(EngineConfigError, match="speculate takes lookup:K"):
        Speculation.parse(spec)


def test_no_speculation() -> None:
    assert Speculation.parse(None) is None and Speculation.parse("off") is None and Speculation.parse("") is None


def test_the_draft_continues_the_longest_latest_match() -> None:
    lookup = Lookup(Speculation(3), [5, 1, 2, 9, 9, 7, 1, 2, 8, 4, 0])
    lookup.extend([7, 1, 2])  # "7 1 2" was followed by 8 4 0; "1 2" alone most lately by 8 as well
    assert lookup.propose() == [8, 4, 0]
    lookup.extend([3, 1, 2])  # "3 1 2" never came before; "1 2" last came before "3"
    assert lookup.propose() == [3, 1, 2]
    assert lookup.propose(limit=1) == [3] and lookup.propose(limit=0) == []


def test_no_match_no_draft() -> None:
    assert Lookup(Speculation(4), [1, 2, 3, 4]).propose() == []  # 4 never came before
    assert Lookup(Speculation(4), []).propose() == []


def test_a_match_at_the_end_drafts_what_there_is() -> None:
    assert Lookup(Speculation(4), [1, 2, 1]).propose() == [2, 1]


def reference_greedy(draft: list[int], rows: np.ndarray) -> tuple[int, int]:
    """The rule restated: the first position where the draft is not the row's argmax; that argmax follows."""
    for i, d in enumerate(draft):
        if int(np.argmax(rows[i])) != d:
            return i, int(np.argmax(rows[i]))
    return len(draft), int(np.argmax(rows[len(draft)]))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 8), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_greedy_keeps_exactly_the_verifiers_argmax(n: int, seed: int, agree: float) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(n + 1, 12)).astype(np.float32)
    rows[rng.random(size=(n + 1, 12)) < 0.3] = -np.inf  # a grammar's mask
    rows[:, 0] = np.maximum(rows[:, 0], -1e9)  # every row has a choice
    draft = [int(np.argmax(r)) if rng.random() < agree else int(rng.integers(12)) for r in rows[:n]]
    seen: list[int] = []
    kept, token = verify(draft, lambda i: (seen.append(i), rows[i])[1], greedy)
    assert (kept, token) == reference_greedy(draft, rows)
    assert seen == list(range(kept + 1))  # each position scored once, in order, only as far as needed


def test_sampling_keeps_the_models_distribution() -> None:
    """A point-mass draft kept with probability p(d), else a token drawn from p without d: the first token's
    distribution is p, whatever the draft (20,000 draws, within 0.015 of p everywhere)."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    choose = sampler(1.0, 1.0, np.random.default_rng(7))
    for draft in ([0], [1], [3]):
        counts = np.zeros(4)
        for _ in range(20_000):
            kept, token = verify(draft, lambda i: logits, choose)
            counts[draft[0] if kept else token] += 1
        assert np.abs(counts / counts.sum() - np.exp(logits)).max() < 0.015


def test_top_p_and_the_mask_bound_what_sampling_can_draw() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.08, 0.02], dtype=np.float64))
    logits[1] = -np.inf  # masked
    choose = sampler(0.7, 0.9, np.random.default_rng(1))
    drawn = {verify([], lambda i: logits, choose)[1] for _ in range(2000)}
    assert drawn <= {0, 2} and 0 in drawn  # never the masked token; 3 lies past top-p
