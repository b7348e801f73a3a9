"""The embedded default on the real model (SmolLM2-135M-Instruct, CPU): the grammar makes every step
parse, the model alone does not produce the format, and the id-aware grammar confines state_focus."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from engine.base import Capabilities, Engine, Generation, Message
from engine.errors import EngineConfigError
from engine.transformers import TransformersEngine
from flowstate import Agent, LoopConfig, Repository
from flowstate.demo import hotel
from flowstate.errors import ProtocolError
from flowstate.nodes import Node, StateType
from flowstate.parse import parse_output

pytestmark = pytest.mark.slow


class Recording(Engine):
    """Passes calls through to the real engine and keeps every prompt, grammar and output."""

    name = "recording"
    capabilities = Capabilities(grammar=True, embedded=True)

    def __init__(self, inner: TransformersEngine) -> None:
        self.inner = inner
        self.calls: list[tuple[list[Message], str | None, Generation]] = []

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None, **_: Any) -> Generation:
        gen = self.inner.generate(messages, grammar=grammar, max_tokens=max_tokens)
        self.calls.append((list(messages), grammar, gen))
        return gen

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


@pytest.fixture(scope="module")
def smol() -> TransformersEngine:
    return TransformersEngine()


def test_every_step_parses_under_the_grammar_and_not_without_it(smol: TransformersEngine) -> None:
    engine = Recording(smol)
    with Repository.open(":memory:") as repo:
        agent = Agent(engine, repository=repo, session="real", tools=hotel.TOOLS, task_policy=hotel.POLICY,
                      config=LoopConfig(max_steps=2, max_protocol_errors=1))
        steps = []
        for query in hotel.QUERIES:  # under the grammar every request ends: its last allowed step answers
            record = agent.run(query)
            assert record.unfinished is None and record.response
            steps += record.to_dict()["steps"]
            if len(steps) >= 2:  # two steps: both parse, and the second reuses the first's KV prefix
                break
    assert len(steps) >= 2
    assert [s["protocol_error"] for s in steps] == [None] * len(steps)
    assert all(s["usage"]["completion_tokens"] > 0 for s in steps)
    assert engine.calls[1][2].usage.cached_tokens > 0  # KV prefix reuse across steps
    # the same prompts without a grammar: the model alone does not write the four blocks
    for messages, _, _ in engine.calls[:2]:
        free = smol.generate(messages, grammar=None, max_tokens=96)
        with pytest.raises(ProtocolError):
            parse_output(free.text)


def test_id_aware_grammar_confines_state_focus(smol: TransformersEngine) -> None:
    engine = Recording(smol)
    with Repository.open(":memory:") as repo:
        def state(node_id: str, summary: str) -> Node:
            return Node(id=node_id, type=StateType.JUDGEMENT, summary=summary, value={"note": summary}, request=1)
        repo.persist_request("s", 1, "Book hotel A and remember my budget", "Booked A.",
                             [state("dec_book_a", "Booked hotel A for $200"), state("pref_budget", "Budget is $250")], {})
        repo.persist_request("other", 1, "secret", "ok", [state("secret_plan", "another session's plan")], {})
        agent = Agent(engine, repository=repo, session="s", tools=hotel.TOOLS, task_policy=hotel.POLICY,
                      config=LoopConfig(max_steps=2, max_protocol_errors=1))
        record = agent.run("Look at secret_plan, obs_r1_s1_1 and dec_book_a: what did I book and what is my budget?")
        assert record.unfinished is None and record.response  # the last allowed step answers
    for _, grammar, gen in engine.calls:
        output = parse_output(gen.text)
        assert {f.target_id for f in output.state_focus} <= {"dec_book_a", "pref_budget"}
        assert grammar is not None and "secret_plan" not in grammar


def test_a_grammar_the_backend_refuses_is_a_clear_error(smol: TransformersEngine) -> None:
    with pytest.raises(EngineConfigError, match="grammar refused"):
        smol.generate([Message("user", "hi")], grammar='start: %json {"type": "object", "propertyNames": {}}')


def test_template_kwargs_reach_the_template_and_a_cut_output_is_truncation(smol: TransformersEngine) -> None:
    from tests.engine.test_chat import MESSAGES, QWEN_STYLE

    saved = smol.tokenizer.chat_template, smol.chat_template_kwargs
    try:
        smol.tokenizer.chat_template = QWEN_STYLE
        assert smol.render(MESSAGES).endswith("<think>\n")
        smol.chat_template_kwargs = {"enable_thinking": False}
        assert "<think>" not in smol.render(MESSAGES)
    finally:
        smol.tokenizer.chat_template, smol.chat_template_kwargs = saved
    cut = smol.generate(MESSAGES, max_tokens=3)
    assert cut.truncated and cut.usage.completion_tokens == 3
    assert smol.capabilities.embedded  # the embedded model: the compact protocol profile is picked for it
