"""Request options on the real embedded model (llama.cpp): a seed reproduces a sampled answer, and under the
real grammar a named tool_choice yields exactly that tool, required yields a tool call, and a json_schema
response format yields content that validates."""

from __future__ import annotations

import json

import pytest

from engine.base import Message, Sampling
from engine.llamacpp import LlamaCppEngine
from flowstate import LoopConfig, Repository
from flowstate.config import AgentConfig
from flowstate.demo import hotel
from flowstate.limits import COMPACT
from flowstate.loop import RequestRun
from flowstate.memory.state import FLOWSTATE
from flowstate.request_options import RequestOptions

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object",
          "properties": {"hotel": {"type": "string", "enum": ["A", "B"]},
                         "reason": {"type": "string", "maxLength": 60}},
          "required": ["hotel", "reason"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llama() -> LlamaCppEngine:
    return LlamaCppEngine()


def test_a_seed_reproduces_a_sampled_answer(llama: LlamaCppEngine) -> None:
    messages = [Message("user", "Write one sentence about a hotel in Lisbon.")]
    sampled = Sampling(temperature=1.0, top_p=0.95, seed=7)
    a = llama.generate(messages, max_tokens=30, sampling=sampled)
    llama.llm.reset()  # the same prompt computed fresh again (a cached prefix is computed in other batch shapes)
    b = llama.generate(messages, max_tokens=30, sampling=sampled)
    assert a.text == b.text and a.usage.completion_tokens > 5


def run(llama: LlamaCppEngine, options: RequestOptions, query: str, steps: int = 3) -> RequestRun:
    repo = Repository.open(":memory:")
    agent = AgentConfig(llama, FLOWSTATE, tools=hotel.TOOLS, policy=hotel.POLICY,
                        loop=LoopConfig(max_steps=steps, max_tokens=512, max_protocol_errors=steps, limits=COMPACT))
    r = RequestRun(engine=llama, repo=repo, session="s", query=query, agent=agent, options=options)
    while r.record is None and not r.pending and len(r.steps) < steps:
        r.step()
    return r


@pytest.mark.parametrize("choice", ["search_hotels", "required"])
def test_tool_choice_yields_a_tool_call(llama: LlamaCppEngine, choice: str) -> None:
    r = run(llama, RequestOptions(tool_choice=choice), hotel.QUERIES[0])
    assert r.record is None and r.pending, [s.raw for s in r.steps]  # never an answer; a call within the steps
    names = {c.name for c in r.pending}
    assert names == {"search_hotels"} if choice == "search_hotels" else names <= set(hotel.TOOLS)


def test_a_json_schema_answer_validates(llama: LlamaCppEngine) -> None:
    from jsonschema import validate

    r = run(llama, RequestOptions(tool_choice="none", answer_schema=SCHEMA), "Answer now: hotel A or B, and why?",
            steps=4)
    assert r.record is not None and r.record.response is not None, [s.raw for s in r.steps]
    validate(json.loads(r.record.response), SCHEMA)
