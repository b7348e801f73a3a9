"""Your own stored sessions as an evaluation suite: a session file kept from format version 1 replays unchanged
(every answer, every call); a model's replay is scored against the stored answers (exact, normalized, F1), its
calls answered from the recording and the others counted off the record; sessions are chosen by name, activity,
sample and feedback; the source is never written; bad combinations of options are refused by name."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engine.scripted import ScriptedEngine
from flowstate import Repository
from flowstate.cli import main
from flowstate.eval.replay import RecordedCall
from flowstate.eval.runner import EvalConfig, run_eval, source_label
from flowstate.eval.stored import Selection, choose, f1, generate, inferred_schema, normalize, parse_since
from flowstate.store.feedback import Feedback
from tests.helpers import output

V1 = Path(__file__).parents[2] / "data" / "session-v1.jsonl"
SEARCH = {"city": "Lisbon", "check_in": "2026-12-10", "check_out": "2026-12-12", "as_of": "2026-12-01"}


def _replayed(tmp: Path, engines: tuple[Any, ...] = (), **given: Any) -> list[Any]:
    config = EvalConfig(suites=("sessions",), strategies=given.pop("strategies", ("flowstate", "full-context")),
                        tasks=10, depth=1, out=tmp, replay=str(given.pop("source", V1)), **given)
    return run_eval(config, list(engines))


def test_a_version_1_session_file_replays_unchanged(tmp_path: Path) -> None:
    rows = _replayed(tmp_path / "a", policy="realistic")
    again = _replayed(tmp_path / "b", policy="realistic")
    assert {(r.strategy, r.task) for r in rows} == {("flowstate", "trip"), ("full-context", "trip")}
    for row in rows:
        assert row.success and [s.detail["exact"] for s in row.subtasks] == [True, True, True]  # type: ignore[index]
        assert [s.detail["off_record"] for s in row.subtasks] == [0, 0, 0]  # type: ignore[index]
        assert [s.tool_calls for s in row.subtasks] == [1, 1, 0]  # the server's tool and the client's
    assert [s.response for r in rows for s in r.subtasks] == [s.response for r in again for s in r.subtasks]
    diff = (tmp_path / "a" / "sessions.md").read_text()
    assert "## trip × flowstate: 3/3 answers agree" in diff and "Hotel Avenida" in diff


def test_a_models_replay_is_scored_and_its_calls_answered_from_the_recording(tmp_path: Path) -> None:
    engine = ScriptedEngine([
        output(tools=[{"name": "search_hotels", "arguments": SEARCH}]),  # the recorded call: its recorded result
        output(content="hotel avenida has a room at 95 EUR a night"),  # the same answer, but for case and stops
        output(tools=[{"name": "calendar_add", "arguments": {"date": "2026-12-11", "title": "Lisbon"}}]),  # off it
        output(content="Done."),
        output(content="It was Hotel Avenida, 95 EUR a night."),
    ])
    [row] = _replayed(tmp_path, (engine,), strategies=("flowstate",))
    first, second, third = (s.detail for s in row.subtasks)
    assert first == {"exact": False, "normalized": True, "f1": 1.0, "off_record": 0, "recorded_calls": 1}
    assert second["off_record"] == 1 and not second["normalized"] and second["f1"] == 0.0  # type: ignore[index]
    assert third["exact"] and not row.success  # type: ignore[index]
    observed = "\n".join(m.content for p in engine.prompts for m in p)
    assert "Hotel B (Alfama)" in observed and "the stored session never made it (off the record)" in observed
    system = engine.prompts[0][0].content
    assert "search_hotels" in system and "calendar_add" in system  # every tool the session called is offered


def test_sessions_are_chosen_by_name_activity_sample_and_feedback(tmp_path: Path) -> None:
    db = tmp_path / "prod.db"
    with Repository.open(db) as repo:
        for name in ("one", "two", "three"):
            with V1.open() as lines:
                repo.transfer.load(lines, rename={"trip": name})
        repo.feedback.give(Feedback("two", 2, "key_1", -1.0, None, "wrong date", time.time()))
        repo.feedback.give(Feedback("three", 1, "key_1", 0.5, None, "", time.time()))
        assert choose(repo, Selection(feedback="negative"), 10) == ["two"]
        assert sorted(choose(repo, Selection(feedback="any"), 10)) == ["three", "two"]
        assert choose(repo, Selection(sessions=("one",)), 10) == ["one"]
        sample = choose(repo, Selection(sample=2, seed=7), 10)
        assert len(sample) == 2 and sample == choose(repo, Selection(sample=2, seed=7), 10)
        assert choose(repo, Selection(since=int(time.time()) + 3600), 10) == []
        with pytest.raises(ValueError, match="no stored session 'four'"):
            choose(repo, Selection(sessions=("four",)), 10)
    [task] = generate(str(db), 10, Selection(sessions=("two",)))
    assert task.feedback == {2: -1.0} and task.tokens[0] > 0


def test_the_source_is_never_written_and_the_replay_is_kept_apart(tmp_path: Path) -> None:
    db = tmp_path / "prod.db"
    with Repository.open(db) as repo, V1.open() as lines:
        repo.transfer.load(lines)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    out = tmp_path / "replay"
    result = CliRunner().invoke(main, ["eval", "--from", str(db), "--policy", "realistic", "--strategy", "flowstate",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    with Repository.open(out / "memory.db") as replay:
        assert replay.sessions() == ["sessions/flowstate/trip"]  # the console and inspect show it there
    assert json.loads((out / "config.json").read_text())["replay"] == str(db.resolve())
    # a database URL is recorded without its password
    assert source_label("postgresql://fs:s3cret@db:5432/prod") == "postgresql://fs:***@db:5432/prod"


@pytest.mark.parametrize(("args", "said"), [
    (["--from", "x.db", "--suite", "hotel"], "without --suite"),
    (["--session", "trip"], "give --from"),
    (["--from", "same.db", "--db", "same.db"], "never the database it replays"),
    (["--from", "missing.jsonl"], "no such database or session file"),
    (["--from", str(V1), "--since", "yesterday"], "--since takes a duration"),
])
def test_bad_choices_of_stored_sessions_are_refused(tmp_path: Path, args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["eval", *args, "--policy", "realistic", "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and said in result.output, result.output


def test_agreement_and_inferred_schemas() -> None:
    assert normalize("Hotel  Avenida, 95 EUR!") == "hotel avenida 95 eur" and f1("a b c",
                                                                                 "a b d") == pytest.approx(2 / 3)
    assert f1("", "") == 1.0 and f1("x", "") == 0.0
    schema = inferred_schema([RecordedCall("t", {"a": 1, "b": "x"}, None), RecordedCall("t", {"a": 2, "c": [1]}, None)])
    assert schema == {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                                       "c": {"type": "array"}}, "required": ["a"]}
    assert abs(parse_since("1d", now=86_400 * 10) - 86_400 * 9) == 0 and parse_since("2026-12-01") == 1796083200


def test_a_judge_says_whether_the_replay_agrees_and_its_prompt_is_versioned() -> None:
    from flowstate.eval.stored import JUDGE, JUDGE_VERSION

    judge = ScriptedEngine(["AGREE", "DISAGREE, it booked another date", "maybe"])
    [task] = generate(str(V1), 1, Selection(), judge)
    env = task.new_env()
    verdicts = [task.check(k, "Some answer.", env).detail["judge"] for k in (1, 2, 3)]  # type: ignore[index]
    assert verdicts == [1.0, 0.0, None]  # neither word: no verdict, never a guess
    asked = judge.prompts[0]
    assert (asked[0].content == JUDGE and "REFERENCE:\nHotel Avenida" in asked[1].content
            and JUDGE_VERSION == "agreement-v1")


def test_a_session_stored_with_its_tools_replays_with_them(tmp_path: Path) -> None:
    """A request's run record keeps the tools it offered (the server's; a memory method's own are the method's) and
    the policy it ran under: the replay offers them as they were — their descriptions, their schemas, the ones never
    called too — under that policy."""
    from flowstate import Agent
    from flowstate.demo import hotel

    db = tmp_path / "prod.db"
    with Repository.open(db) as repo:
        search = {"name": "search_hotels", "arguments": SEARCH}
        Agent(ScriptedEngine([output(tools=[search]), output(content="Hotel B is cheaper.")]), repository=repo,
              session="trip", tools=hotel.TOOLS, task_policy="Quote prices in euros.").run("Find me a hotel in Lisbon.")
        kept = {t["name"] for t in repo.records.request("trip", 1)["tools"]}  # type: ignore[index]
        assert repo.records.request("trip", 1)["policy"] == "Quote prices in euros."  # type: ignore[index]
    assert kept == {t["name"] for t in hotel.TOOLS.specs()}
    engine = ScriptedEngine([output(tools=[search]), output(content="Hotel B is cheaper.")])
    [row] = _replayed(tmp_path / "out", (engine,), strategies=("flowstate",), source=db)
    assert row.success and row.subtasks[0].detail["off_record"] == 0  # type: ignore[index]
    system = engine.prompts[0][0].content
    described = next(t for t in hotel.TOOLS.specs() if t["name"] == "book_transfer")["description"]
    assert described in system and "inferred from" not in system  # as the session offered them, the unused one too
    assert "Quote prices in euros." in system  # and under the policy it ran under


def test_a_served_session_keeps_its_clients_system_message_for_the_replay(tmp_path: Path) -> None:
    """Through the endpoint, the client's system message is the request's policy: the record keeps it, and a replay of
    the exported session runs under it."""
    import openai
    from fastapi.testclient import TestClient

    from serving.app import create_app
    from serving.services import ServerConfig

    with Repository.open(tmp_path / "prod.db") as repo:
        with TestClient(create_app(ServerConfig(engine=ScriptedEngine([output(content="ok")]), repo=repo)),
                        base_url="http://flowstate.test") as http:
            api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key="x", http_client=http, max_retries=0)
            api.chat.completions.create(model="flowstate", user="chat", messages=[
                {"role": "system", "content": "You are the airline's agent. Confirm before acting."},
                {"role": "user", "content": "Cancel my booking."}])
        assert repo.records.request("chat", 1)["policy"] == "You are the airline's agent. Confirm before acting."  # type: ignore[index]
    [task] = generate(str(tmp_path / "prod.db"), 1)
    assert task.policy == "You are the airline's agent. Confirm before acting."
