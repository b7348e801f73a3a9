"""The request-local append-only layout (``+append``, ``--layout append``): within a request every call's prompt
extends the previous call's prompt and output, the request collapses into its index line when it ends, and the
method's rules and validation are those of the paper's layout."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from engine.scripted import ScriptedEngine
from engine.text import flatten
from flowstate import Agent, Repository, tags
from flowstate.cli import main
from flowstate.memory import get, laid_out
from flowstate.memory.base import Strategy
from flowstate.memory.state import FLOWSTATE
from tests.flowstate.test_strategies import run_oracle
from tests.helpers import add, output

APPEND = get("flowstate+append")


def extends(before: str, output_text: str, after: str) -> bool:
    """The later prompt begins with the earlier one and the output it decoded: a prefix cache computes neither."""
    return after.startswith(before + output_text)


@pytest.mark.parametrize("suite", ["hotel", "shopping"])
def test_every_call_of_a_request_extends_the_previous_one_and_each_request_starts_from_its_index(
        tmp_path, suite) -> None:
    results = {}
    for strategy in (FLOWSTATE, APPEND):
        with Repository.open(tmp_path / f"{strategy.name}.db") as repo:
            task, engine, firsts = run_oracle(repo, suite, strategy, depth=4)
        prompts = [(flatten(m), g.text) for m, _, g in engine.calls]
        within = [i for i in range(1, len(prompts)) if i not in firsts]
        assert within, "every request took one call: nothing to compare"
        results[strategy.name] = [extends(*prompts[i - 1], prompts[i][0]) for i in within]
        # a new request starts afresh: the system message, then the index (the previous request is a line of it)
        for k, first in enumerate(firsts[1:], start=2):
            user = engine.calls[first][0][1].content
            assert len(engine.calls[first][0]) == 2 and user.startswith(f"<{tags.HISTORICAL_INDEX}>")
            assert f'"query_id":{k - 1}' in user
    assert all(results["flowstate+append"])
    assert not all(results["flowstate"])  # the paper's layout re-renders its tail: the property is the layout's


def test_what_a_step_brought_follows_its_output_disclosures_feedback_and_results(tmp_path) -> None:
    engine = ScriptedEngine([
        output(delta=[add("a", x=1)], content="first"),
        # request 2: ask for a, write a bad ref, call a tool
        output(focus=["a"], delta=[add("bad", refs=[("supports", "missing")])], tools=[{"name": "echo",
                                                                                      "arguments": {"text": "hi"}}]),
        "not the protocol",
        output(content="done"),
    ])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", tools=[echo], strategy=APPEND)
        agent.run("remember one")
        record = agent.run("use it")
    assert record.response == "done"
    last = engine.prompts[-1]
    assert [m.role for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last[2].content == record.steps[0].raw and last[4].content == "not the protocol"
    brought = last[3].content
    assert tags.read(brought, tags.ACTIVE_STATE) is not None and '"state_id":"a"' in brought  # disclosed
    assert '"kind":"rejected"' in tags.read(brought, tags.FEEDBACK)  # the bad ref, refused with its reason
    assert '"result":"hi"' in tags.read(brought, tags.TOOL_RESULTS)
    assert '"kind":"protocol_error"' in tags.read(last[5].content, tags.FEEDBACK)
    assert "stay in the chat as they happened" in last[0].content
    assert "stay in the chat as they happened" not in FLOWSTATE.system_prompt([])


def echo(text: str) -> str:
    """Echo the text."""
    return text


@pytest.mark.parametrize("name", ["flowstate+append", "flowstate-paged:512+append", "no-psa+append", "no-isu+append"])
def test_every_state_method_has_the_layout_with_its_own_blocks(name) -> None:
    strategy: Strategy = get(name)
    base = get(name.removesuffix("+append"))
    assert strategy.name == name and strategy.blocks == base.blocks
    assert strategy.layout == "append" and base.layout == "latest"  # type: ignore[attr-defined]


def test_the_layout_is_refused_where_a_method_lays_out_its_own_prompt() -> None:
    with pytest.raises(ValueError, match="lays out its own prompt"):
        get("bm25+append")
    with pytest.raises(ValueError, match="none of full-context, bm25 is one"):
        laid_out(("full-context", "bm25"), "append")
    assert laid_out(("flowstate", "full-context"), "append") == ("flowstate+append", "full-context")
    assert laid_out(("flowstate",), "latest") == ("flowstate",)


def test_the_cli_runs_the_state_methods_in_the_layout(tmp_path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"text": output(content="hello")}) + "\n")
    ran = CliRunner().invoke(main, ["run", "hi", "--engine", "scripted", "--script", str(script), "--db",
                                    str(tmp_path / "m.db"), "--layout", "append"])
    assert ran.exit_code == 0 and ran.output.strip() == "hello", ran.output
    out = tmp_path / "ev"
    evaluated = CliRunner().invoke(main, ["eval", "--suite", "hotel", "--policy", "oracle", "--tasks", "1",
                                          "--strategy", "flowstate,full-context", "--layout", "append", "--out",
                                          str(out)])
    assert evaluated.exit_code == 0, evaluated.output
    pairs = json.loads((out / "summary.json").read_text())["pairs"]
    assert {p["strategy"] for p in pairs} == {"flowstate+append", "full-context"}
    bad = CliRunner().invoke(main, ["eval", "--suite", "hotel", "--policy", "oracle", "--strategy", "bm25",
                                    "--layout", "append", "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "a layout of the state methods" in bad.output
