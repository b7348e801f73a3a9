"""A memory method's JSON replies: one pydantic model each, the grammar made from its schema, the reply read back
with it (``flowstate/memory/calls.py``) — the bounds stated once, in the model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from flowstate.memory import calls
from flowstate.memory.mage import CHECK_GRAMMAR, SUMMARY_GRAMMAR, Check, Summary
from flowstate.memory.retrieval import FACTS_GRAMMAR, UPDATE_GRAMMAR, Facts, MemoryUpdate
from flowstate.memory.tracker import STATE_GRAMMAR, TrackedState
from grammars.check import accepts, validate

REPLIES: list[tuple[type[BaseModel], str, dict[str, Any]]] = [
    (Summary, SUMMARY_GRAMMAR, {"summary": "booked flight F1 for 300 USD"}),
    (Check, CHECK_GRAMMAR, {"valid": False, "note": "the price is 320"}),
    (Facts, FACTS_GRAMMAR, {"facts": ["the order is #W1", "the budget is 500 USD"]}),
    (MemoryUpdate, UPDATE_GRAMMAR, {"memory": [{"id": "0", "text": "the budget is 600 USD", "event": "UPDATE",
                                            "old_memory": "the budget is 500 USD"}]}),
    (TrackedState, STATE_GRAMMAR,
     {"goal": "book", "world": {"order": "#W1", "items": [1, 2]}, "constraints": ["cheap"]}),
]


def compact(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(", ", ": "))


@pytest.mark.parametrize(("model", "grammar", "example"), REPLIES, ids=lambda x: getattr(x, "__name__", None))
def test_each_reply_grammar_is_its_models_schema(model: type[BaseModel], grammar: str, example: dict[str, Any]) -> None:
    validate(grammar)
    assert grammar == calls.grammar(model)  # made from the model, not written beside it
    assert accepts(grammar, compact(example))
    assert calls.reply("Sure: " + compact(example), model) == model.model_validate(example)
    assert not accepts(grammar, compact({**example, "extra": 1}))  # no field the model lacks
    assert calls.reply(compact({**example, "extra": 1}), model) is None
    assert calls.reply("no JSON here", model) is None


def test_the_models_bounds_are_the_grammars() -> None:
    too_many = {"facts": [f"fact {i}" for i in range(17)]}  # Facts holds at most 16
    assert not accepts(FACTS_GRAMMAR, compact(too_many)) and calls.reply(compact(too_many), Facts) is None
    sixteen = {"facts": [f"fact {i}" for i in range(16)]}
    assert accepts(FACTS_GRAMMAR, compact(sixteen))
    long_note = {"valid": True, "note": "x" * 401}  # Check's note is at most 400 characters
    assert not accepts(CHECK_GRAMMAR, compact(long_note)) and calls.reply(compact(long_note), Check) is None
    assert not accepts(UPDATE_GRAMMAR,
                       compact({"memory": [{"id": "0", "text": "t", "event": "MERGE", "old_memory": ""}]}))
