"""The strategies: the same loop, only the memory differs — prompts, protocols and grammars per strategy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from engine.base import Capabilities, Engine, Generation, Message
from engine.purpose import STEP, Purpose
from flowstate import Agent, Repository
from flowstate.errors import ProtocolError
from flowstate.eval.policies import BOUNDED, Policy, PolicyEngine
from flowstate.eval.suites import generate
from flowstate.eval.task import Task
from flowstate.memory import METHODS as STRATEGIES
from flowstate.memory import get
from flowstate.memory.base import Strategy
from flowstate.memory.chat import FULL_CONTEXT
from flowstate.memory.state import FLOWSTATE, NO_ISU, NO_PSA
from flowstate.parse import parse_output
from grammars.check import accepts
from tests.helpers import output


class Recording(Engine):
    """The oracle as an engine that takes grammars, recording every (prompt, grammar, output)."""

    name = "recording"
    capabilities = Capabilities(grammar=True)

    def __init__(self, task: Task, strategy: Strategy) -> None:
        self.inner = PolicyEngine(Policy(task, strategy, memory=True))
        self.calls: list[tuple[list[Message], str | None, Generation]] = []

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 purpose: Purpose = STEP, **_: Any) -> Generation:
        gen = self.inner.generate(messages, purpose=purpose)
        self.calls.append((list(messages), grammar, gen))
        return gen

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


def run_oracle(repo: Repository, suite: str, strategy: Strategy, depth: int) -> tuple[Task, Recording, list[int]]:
    task = generate(suite, 1, depth)[0]
    env = task.new_env()
    engine = Recording(task, strategy)
    agent = Agent(engine, repository=repo, session=f"{suite}/{strategy.name}", tools=task.tools(env), strategy=strategy)
    firsts = []
    for k, query in enumerate(task.queries, start=1):
        env["day"] = k
        firsts.append(len(engine.calls))
        agent.run(query)
        solved = task.check(k, agent.repository.requests(agent.session)[-1].response, env).correct
        assert solved or strategy.name in BOUNDED and k > 1
    return task, engine, firsts


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_strategys_grammar_admits_its_protocol_and_the_oracles_outputs(repo: Repository, name: str) -> None:
    strategy = get(name)
    _, engine, _ = run_oracle(repo, "bundle", strategy, 3)
    for messages, grammar, gen in engine.calls:
        assert grammar is not None and accepts(grammar, gen.text), gen.text
        for block in ("state_focus", "state_delta"):
            if block in strategy.optional:  # written only when it holds something, never empty
                assert f"<{block}>\n[]" not in gen.text
            else:
                assert (f"<{block}>" in gen.text) == (block in strategy.blocks)
            told = "\n".join(m.content for m in messages if m.role != "assistant")  # the protocol it is told
            assert (f"<{block}>" in told) == (block in strategy.blocks) or (
                block == "state_focus" and block in strategy.optional and "<historical_state_index>" not in told) or (
                block == "state_delta" and block in strategy.optional and "<state_record>" not in told)  # lean
    four = output(tools=[{"name": "buy", "arguments": {"item": "x"}}])
    assert accepts(engine.calls[0][1] or "", four) == (strategy.blocks == FLOWSTATE.blocks and not strategy.optional)


def test_a_strategy_parses_only_its_own_blocks() -> None:
    four = output(tools=[{"name": "t", "arguments": {}}])
    with pytest.raises(ProtocolError, match="unexpected tag <state_focus> before <tool_calls>"):
        parse_output(four, FULL_CONTEXT.blocks)
    two = "<tool_calls>\n[]\n</tool_calls>\n<assistant_message>\n{\"content\": \"done\"}\n</assistant_message>"
    assert parse_output(two, FULL_CONTEXT.blocks).final_response == "done"
    with pytest.raises(ProtocolError, match="missing <state_focus>"):
        parse_output(two)
    with pytest.raises(ProtocolError, match="all of state_delta, the execution decision are empty"):
        parse_output("<state_delta>\n[]\n</state_delta>\n" + two.replace('"done"', "null"), NO_PSA.blocks)


def test_full_context_grows_with_history_and_the_index_stays_compact(repo: Repository) -> None:
    depth = 6
    task, flow, flow_firsts = run_oracle(repo, "chain", FLOWSTATE, depth)
    _, full, full_firsts = run_oracle(repo, "chain", FULL_CONTEXT, depth)
    flow_tokens = [flow.calls[i][2].usage.prompt_tokens for i in flow_firsts]
    full_tokens = [full.calls[i][2].usage.prompt_tokens for i in full_firsts]
    assert all(b > a for a, b in zip(full_tokens, full_tokens[1:], strict=False))  # the transcript only grows
    growth = lambda xs: (xs[-1] - xs[0]) / (len(xs) - 1)  # noqa: E731
    assert growth(full_tokens) > 1.3 * growth(flow_tokens)

    last_full = "".join(m.content for m in full.calls[full_firsts[-1]][0][1:])
    last_flow = flow.calls[flow_firsts[-1]][0][1].content
    for j in range(1, depth):  # every earlier reading is in full-context's prompt, raw
        assert f'"reading_{j}":{task.readings[j - 1]}' in last_full
    index = last_flow.split("<historical_state_index>\n")[1].split("</historical_state_index>")[0]
    assert len(index.splitlines()) == depth - 1 and '"reading_1":' not in last_flow  # ids and summaries only
    # the index of request k is a byte prefix of request k+1's (prefix caching across requests)
    indexes = [flow.calls[i][0][1].content.split("</historical_state_index>")[0] for i in flow_firsts]
    assert all(b.startswith(a) for a, b in zip(indexes, indexes[1:], strict=False))


def test_full_context_is_the_chat_in_order_and_every_prompt_extends_the_last(repo: Repository) -> None:
    """Chat order, append-only: each call's messages begin with every message of the call before it, across
    steps and requests, so a prefix cache serves all but what is new (tool results are sent once)."""
    _, full, _ = run_oracle(repo, "shopping", FULL_CONTEXT, 3)
    prompts = [messages for messages, _, _ in full.calls]
    for before, after in zip(prompts, prompts[1:], strict=False):
        assert after[: len(before)] == before and len(after) > len(before)
    roles = [m.role for m in prompts[-1]]
    assert roles[0] == "system" and roles[-1] == "user"
    assert all(a != b for a, b in zip(roles[1:], roles[2:], strict=False))  # user and assistant alternate
    results = [m.content for m in prompts[-1] if m.content.startswith("<tool_results>")]
    ids = [line.split('"observation_id":"')[1].split('"')[0] for r in results for line in r.splitlines()[1:-1]]
    assert len(ids) == len(set(ids)) > 3  # every tool result once, in the order it came
    # on a perfect prefix cache each call pays only what is new since the call before (the generation prompt's
    # few tokens at the end aside)
    usage = [u.usage for _, _, u in full.calls]
    assert all(after.cached_tokens >= before.prompt_tokens - 4 for before, after in zip(usage, usage[1:], strict=False))


def test_no_psa_inlines_every_historical_state_and_no_isu_builds_rule_states(repo: Repository) -> None:
    task, engine, firsts = run_oracle(repo, "chain", NO_PSA, 3)
    prompt = engine.calls[firsts[-1]][0][1].content
    assert "<historical_state_index>" not in prompt
    assert prompt.count('"source_query":') == 2 and '"reading_1":' in prompt  # both earlier states, with content

    _, engine, firsts = run_oracle(repo, "chain", NO_ISU, 3)
    nodes = {n.id: n for n in repo.nodes("chain/no-isu")}
    assert [n for n in nodes if not n.startswith("obs_")] == ["response_r1", "response_r2", "response_r3"]
    assert [r.state_id for r in nodes["response_r2"].refs] == ["obs_r2_s1_1"]
    step1, step2 = engine.calls[firsts[-1]], engine.calls[firsts[-1] + 1]
    # the running total needs the earlier readings: ask for the rule states while measuring
    assert '"state_id":"response_r1"' in step1[0][1].content and "<trajectory>" in step1[0][1].content
    assert '"target_id": "response_r1"' in step1[2].text and '"name": "measure"' in step1[2].text
    # the readings are in the tool results those states derive from: reachable only by asking for them
    assert '"related_states":[{"rel":"derives","state_id":"obs_r1_s1_1"}]' in step2[0][1].content
    assert '"target_id": "obs_r1_s1_1"' in step2[2].text


def test_unknown_strategy_is_a_clear_error() -> None:
    with pytest.raises(ValueError,
                       match="valid strategies: flowstate, flowstate-paged, flowstate-facts, flowstate-lean, "
                             "full-context, no-psa, no-isu"):
        get("magic")
    for bad in ("flowstate-paged:0", "flowstate-paged:x", "flowstate:4096"):  # only flowstate-paged takes a budget
        with pytest.raises(ValueError, match=r"flowstate-paged:N: an index budget of N tokens"):
            get(bad)
    for bad in ("flowstate-lean:x", "flowstate-lean:-1"):
        with pytest.raises(ValueError, match=r"flowstate-lean:N: states past N earlier requests"):
            get(bad)
    assert get("flowstate-lean:0").crossover == 0 and get("flowstate-lean").crossover == 30  # type: ignore[attr-defined]
    paged = get("flowstate-paged:8192")
    assert paged.name == "flowstate-paged:8192" and paged.index_budget == 8192  # type: ignore[attr-defined]




def test_flowstate_facts_records_each_tool_result_as_a_state_the_model_need_not_write(repo: Repository) -> None:
    from flowstate.memory.state import FACTS_RULE, FLOWSTATE_FACTS

    task, engine, firsts = run_oracle(repo, "chain", FLOWSTATE_FACTS, 3)
    nodes = {n.id: n for n in repo.nodes("chain/flowstate-facts")}
    fact = nodes["fact_r1_s1_1"]  # the first request's reading, recorded by rule as it came in
    assert fact.mark == "flowstate-facts.fact" and fact.type.value == "knowledge" and fact.request == 1
    assert [(r.rel.value, r.state_id) for r in fact.refs] == [("supports", "obs_r1_s1_1")] and "obs_r1_s1_1" in nodes
    assert fact.value["tool"] == nodes["obs_r1_s1_1"].value["tool"]
    assert fact.value["result"] == nodes["obs_r1_s1_1"].value["result"] and fact.summary.startswith("measure(")
    # the step after the call shows the fact in the Active State; no output adds a knowledge state of its own
    step2 = engine.calls[firsts[0] + 1][0]
    assert FACTS_RULE in step2[0].content and '"state_id":"fact_r1_s1_1"' in step2[1].content
    assert not any('"state_set": "knowledge"' in gen.text for _, _, gen in engine.calls)
    # a later request reaches the facts through the index, as any state
    assert '"state_id":"fact_r1_s1_1"' in engine.calls[firsts[-1]][0][1].content
