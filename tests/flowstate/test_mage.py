"""MAGE on the seam: Compress and Maintain at request ends, the active path, Revise, the ablations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from flowstate.memory.mage import (
    COMPRESS,
    MAGE,
    MAGE_NO_COMPRESS,
    MAGE_NO_MAINTAIN,
    MAGE_NO_REVISE,
    MAINTAIN,
    load_tree,
)


def answer(content: str) -> str:
    return (f"<tool_calls>\n[]\n</tool_calls>\n<assistant_message>\n{json.dumps({'content': content})}\n"
            "</assistant_message>")


def call(name: str, **arguments: Any) -> str:
    calls = json.dumps([{"name": name, "arguments": arguments}])
    return f"<tool_calls>\n{calls}\n</tool_calls>\n<assistant_message>\n{{\"content\": null}}\n</assistant_message>"


def summary(text: str) -> str:
    return json.dumps({"summary": text})


OK = json.dumps({"valid": True, "note": ""})


def echo(x: int) -> int:
    """Return x."""
    return x


def test_compress_and_maintain_grow_the_active_path(tmp_path: Path) -> None:
    engine = ScriptedEngine([
        call("echo", x=7), answer("x is 7"), summary("Echoed 7."), OK,
        answer("it was 7"), summary("Recalled 7."), json.dumps({"valid": False, "note": "says nothing new"}),
        answer("done"), summary("Done."), OK,
    ])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=MAGE, tools=[echo])
        first = agent.run("Echo 7.")
        agent.run("What was x?")
        agent.run("Anything else?")
        tree = load_tree(repo.nodes("s"))
    assert [c.raw for c in first.memory_calls] == [summary("Echoed 7."), OK]
    assert engine.prompts[2][0].content.startswith(COMPRESS) and engine.prompts[3][0].content.startswith(MAINTAIN)
    later = engine.prompts[4][1].content  # request 2 sees the summary, not request 1's raw tool result
    assert '{"step":1,"summary":"Echoed 7."}' in later and '"tool":"echo"' not in later
    # Maintain gates: the rejected summary stays off the active path; its note is a hint
    assert tree.path() == [1, 3] and tree.summaries[2]["trusted"] is False and tree.summaries[3]["parent"] == 1
    last = engine.prompts[7][1].content
    assert '"hint":"segment found wanting, kept off the active path","note":"says nothing new","step":2' in last
    assert '"summary":"Recalled 7."' not in last


def test_an_unparsable_maintain_reply_fails_closed(tmp_path: Path) -> None:
    engine = ScriptedEngine([answer("a"), summary("Did a."), "I think it is fine", answer("b"), summary("Did b."), OK])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=MAGE)
        first = agent.run("Do a.")
        agent.run("Do b.")
        tree = load_tree(repo.nodes("s"))
    assert first.memory_calls[1].protocol_error is not None
    assert tree.summaries[1]["trusted"] is False and tree.path() == [2] and tree.summaries[2]["parent"] is None
    assert '"summary":"Did a."' not in engine.prompts[3][1].content


def test_revise_moves_the_active_path_back_and_keeps_the_old_branch_as_a_hint(tmp_path: Path) -> None:
    engine = ScriptedEngine([
        answer("booked A"), summary("Booked hotel A."), OK,
        answer("booked B"), summary("Booked hotel B, a mistake."), OK,
        call("revise_memory", step=2, reason="B was wrong"), answer("back to A"), summary("Kept A."), OK,
        answer("fine"), summary("Fine."), OK,
    ])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=MAGE)
        for q in ("Book A.", "Book B.", "Undo B.", "Status?"):
            agent.run(q)
        tree = load_tree(repo.nodes("s"))
    assert '"name":"revise_memory"' in engine.prompts[0][0].content  # the agent is given the tool
    assert tree.summaries[3]["parent"] == 1 and tree.path() == [1, 3, 4]  # "Kept A." grew from before step 2
    last = engine.prompts[-3][1].content
    assert '"hint":"explored alternative, off the active path","step":2' in last
    assert '{"step":3,"summary":"Kept A."}' in last and '{"step":2,"summary"' not in last
    assert '"diagnosis":"B was wrong","hint":"revised","left":2' in last  # Revise's diagnosis stays a hint
    # Revise acts within the request: the step after the call already sees the restored path and the diagnosis
    before, after = engine.prompts[6][1].content, engine.prompts[7][1].content
    assert '{"step":2,"summary":"Booked hotel B, a mistake."}' in before
    assert '{"step":2,"summary"' not in after.split("</execution_state>")[0] and '"diagnosis":"B was wrong"' in after


def test_each_ablation_switches_off_only_what_its_name_says(tmp_path: Path) -> None:
    bad = json.dumps({"valid": False, "note": "wrong x"})
    engine = ScriptedEngine([call("echo", x=3), answer("3"), OK, call("echo", x=4), answer("4"), bad,
                             answer("it was 3"), OK])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=MAGE_NO_COMPRESS, tools=[echo])
        first = agent.run("Echo 3.")
        agent.run("Echo 4.")
        agent.run("What was it?")
        tree = load_tree(repo.nodes("s"))
    # no Compress: no summary call, but Maintain checks the raw trajectory and Revise is still given
    assert [c.raw for c in first.memory_calls] == [OK] and engine.prompts[2][0].content.startswith(MAINTAIN)
    assert tree.path() == [1, 3] and tree.summaries[1]["summary"] is None and tree.summaries[2]["trusted"] is False
    last = engine.prompts[-2][1].content  # the raw steps of the active path stay in view, the quarantined ones not
    assert '"arguments":{"x":3}' in last and '"arguments":{"x":4}' not in last and '"note":"wrong x"' in last
    assert '"name":"revise_memory"' in engine.prompts[0][0].content

    engine = ScriptedEngine([answer("a"), summary("Did a.")])
    with Repository.open(tmp_path / "n.db") as repo:
        record = Agent(engine, repository=repo, session="s", strategy=MAGE_NO_MAINTAIN).run("Do a.")
        assert [c.raw for c in record.memory_calls] == [summary("Did a.")]  # Compress, no Maintain
        assert load_tree(repo.nodes("s")).path() == [1]
    assert '"name":"revise_memory"' not in Agent(ScriptedEngine([]), repository=Repository.open(":memory:"),
                                                  session="t", strategy=MAGE_NO_REVISE).system


def test_the_report_sets_flowstate_and_mage_head_to_head(tmp_path: Path) -> None:
    from flowstate.eval.report import markdown, summarize
    from flowstate.eval.runner import EvalConfig, run_eval

    config = EvalConfig(suites=("chain", "shopping"), strategies=("flowstate", "full-context", "mage"), tasks=1,
                        depth=3,
                        out=tmp_path, policy="oracle")
    text = markdown(summarize(run_eval(config, []), config))
    section = text.split("## FlowState and MAGE head to head")[1].split("## chain")[0]
    assert "| chain | 100.0 / 100.0 |" in section and "| shopping | 100.0 / 100.0 |" in section
