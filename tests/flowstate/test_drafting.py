"""Drafting replayed on a recorded call (``flowstate/bench/drafting.py``): a draft token is kept exactly when it is
the recorded output's next token, each step yields what it kept plus one, and the tally adds up."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flowstate.bench.drafting import Drafter, Tally


def fixed(draft: list[int]) -> Any:
    return lambda context, most: draft[:most]


def test_a_step_keeps_the_drafts_prefix_the_output_continues_with_and_one_more() -> None:
    d = Drafter(prompt=[1, 2, 3], output=[7, 8, 9, 5, 6], k=4, propose=fixed([8, 9, 4, 4]))
    assert d.draft() == 0 and d.advance(0) == 1  # the prefill's first token: no draft
    assert d.draft() == 4 and d.advance(4) == 3  # 8, 9 kept; the verifier chose 5
    assert (d.produced, d.drafted, d.kept, d.steps) == (4, 4, 2, 1)
    d.propose = fixed([6, 6, 6])
    assert d.draft() == 3 and d.advance(3) == 1 and d.done  # one token was left: the verifier's own
    assert (d.produced, d.drafted, d.kept, d.steps) == (5, 7, 2, 2)


def test_the_scheduler_verifying_less_of_a_draft_keeps_no_more_than_it_verified() -> None:
    d = Drafter(prompt=[1], output=[1, 2, 3, 4, 5, 6], k=4, propose=fixed([2, 3, 4, 5]))
    d.draft(), d.advance(0)
    assert d.draft() == 4 and d.advance(2) == 3 and (d.drafted, d.kept) == (2, 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.lists(st.integers(0, 3), max_size=20),
       st.integers(1, 6))
def test_any_drafts_yield_the_output_exactly_and_the_tally_adds_up(output: list[int], prompt: list[int],
                                                                  k: int) -> None:
    import numpy as np

    def propose(context: Any, most: int) -> list[int]:  # continue the latest earlier occurrence of the last token
        last = int(context[-1])
        earlier = [i for i in range(len(context) - 1) if int(context[i]) == last]
        return [int(t) for t in np.asarray(context)[earlier[-1] + 1:][:most]] if earlier else []

    d = Drafter(prompt, output, k, propose)
    total = 0
    while not d.done:
        total += d.advance(d.draft())
    assert total == d.produced == len(output) and d.kept <= d.drafted
    tally = Tally()
    tally.add(d, forced=0)
    figures = tally.figures()
    assert figures["kept_tokens"] + d.steps + 1 == len(output)  # each decode step one token of its own
    if d.steps:
        assert figures["tokens_per_step"] == round((d.kept + d.steps) / d.steps, 3) >= 1
