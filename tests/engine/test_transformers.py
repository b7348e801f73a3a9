"""The transformers engine on the real model (SmolLM2-135M-Instruct, CPU): the grammar makes every step
parse, the model alone does not produce the format, and the id-aware grammar confines state_focus."""

from __future__ import annotations

import pytest

from engine.base import Message
from engine.errors import EngineConfigError
from engine.transformers import TransformersEngine
from flowstate import Agent, LoopConfig, Repository
from flowstate.demo import hotel
from flowstate.errors import ProtocolError
from flowstate.parse import parse_output
from tests.helpers import Recording

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol() -> TransformersEngine:
    return TransformersEngine()


def test_every_step_parses_under_the_grammar_and_not_without_it(smol: TransformersEngine) -> None:
    engine = Recording(smol)
    with Repository.open(":memory:") as repo:
        agent = Agent(engine, repository=repo, session="real", tools=hotel.TOOLS, task_policy=hotel.POLICY,
                      config=LoopConfig(max_steps=1, max_protocol_errors=1))
        record = agent.run(hotel.QUERIES[0])  # under the grammar the request ends: its one allowed step answers
    assert record.unfinished is None and record.response
    [step] = record.to_dict()["steps"]
    assert step["protocol_error"] is None and step["usage"]["completion_tokens"] > 0
    # the same prompt without a grammar: its KV prefix is reused, and the model alone does not write the four blocks
    free = smol.generate(engine.calls[0][0], grammar=None, max_tokens=96)
    assert free.usage.cached_tokens > 0
    with pytest.raises(ProtocolError):
        parse_output(free.text)


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


def test_salts_keep_tenants_apart_but_for_the_shared_system_prompt(smol: TransformersEngine) -> None:
    """A call salted apart from the cached prompt reuses none of it — or, with the deployment's system prompt
    declared shared, exactly that much and never a token past it; a tenant's own next call reuses its prefix."""
    system = Message("system", hotel.POLICY)
    messages = [system, Message("user", hotel.QUERIES[0])]
    smol.generate(messages, max_tokens=2, cache_salt="tenant-a")
    assert smol.generate(messages, max_tokens=2, cache_salt="tenant-b").usage.cached_tokens == 0
    own = smol.generate(messages, max_tokens=2, cache_salt="tenant-b").usage
    assert own.cached_tokens >= own.prompt_tokens - 1
    try:
        smol.share_prefix([system])
        other = smol.generate(messages, max_tokens=2, cache_salt="tenant-c").usage
        assert other.cached_tokens == len(smol._shared) and 0 < other.cached_tokens < other.prompt_tokens - 1
    finally:
        smol._shared = []
    assert smol.capabilities.shares and smol.capabilities.priority
