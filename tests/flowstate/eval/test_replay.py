"""tau-replay: recorded τ-bench conversations (historical_trajectories format) replayed through every strategy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowstate.eval.replay import ReplayTask, parse
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.memory import METHODS, get


def call(i: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def conversation(user: str, reservation: str) -> list[dict[str, Any]]:
    """A small conversation in τ-bench's recorded format: three requests, five calls (one step with two)."""
    return [
        {"role": "system", "content": "# Airline Agent Policy\nAct only on the user's confirmed requests."},
        {"role": "user", "content": f"Hi, I am {user}. What is on my reservation {reservation}?"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_user_details", user_id=user)]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_user_details",
         "content": json.dumps({"user_id": user, "reservations": [reservation], "membership": "gold"})},
        {"role": "assistant", "content": None, "tool_calls": [
            call("c2", "get_reservation_details", reservation_id=reservation),
            call("c3", "think", thought="check the flights")]},
        {"role": "tool", "tool_call_id": "c2", "name": "get_reservation_details",
         "content": json.dumps({"reservation_id": reservation, "flights": [{"flight_number": "HAT001"}],
                                "cabin": "economy"})},
        {"role": "tool", "tool_call_id": "c3", "name": "think", "content": ""},
        {"role": "assistant", "content": f"Reservation {reservation} has flight HAT001 in economy."},
        {"role": "user", "content": f"Which flight was on reservation {reservation} again?"},
        {"role": "assistant", "content": "It is HAT001."},
        {"role": "user", "content": "Please search direct flights from JFK to SFO on 2024-05-20."},
        {"role": "assistant", "content": None, "tool_calls": [
            call("c4", "search_direct_flight", origin="JFK", destination="SFO", date="2024-05-20")]},
        {"role": "tool", "tool_call_id": "c4", "name": "search_direct_flight", "content": "[]"},
        {"role": "assistant", "content": None, "tool_calls": [call("c5", "think", thought="none found")]},
        {"role": "tool", "tool_call_id": "c5", "name": "think", "content": ""},
        {"role": "assistant", "content": "There are no direct flights that day."},
        {"role": "user", "content": "Thanks. ###STOP###"},
    ]


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    path = tmp_path / "gpt-4o-airline.json"
    path.write_text(json.dumps([{"task_id": 0, "reward": 1.0, "traj": conversation("mia_li_3668", "ABC123")},
                                {"task_id": 1, "reward": 0.0, "traj": conversation("ivan_m_1", "XYZ789")}]))
    return path


def test_a_recording_parses_into_requests_steps_and_answers() -> None:
    policy, turns = parse(conversation("mia_li_3668", "ABC123"))
    assert policy.startswith("# Airline Agent Policy") and len(turns) == 3  # the stop token ends it
    assert [len(s) for s in turns[0].steps] == [1, 2] and turns[1].steps == () and len(turns[2].steps) == 2
    assert turns[0].steps[1][0].result["flights"] == [{"flight_number": "HAT001"}]
    assert turns[2].answer == "There are no direct flights that day."


def test_every_strategy_reproduces_every_recorded_action(recording: Path, tmp_path: Path) -> None:
    config = EvalConfig(suites=("tau-replay",), strategies=tuple(METHODS), tasks=2, depth=1, out=tmp_path / "ev",
                        policy="realistic", replay=str(recording))
    rows = run_eval(config, [])
    assert len(rows) == 2 * len(METHODS)
    assert [(r.strategy, r.task) for r in rows if not r.success] == []
    by = {(r.strategy, r.task): r for r in rows}
    task = rows[0].task
    # request 2's answer repeats HAT001 from request 1's result, which flowstate's prompt shows only as an index
    # summary: it asks for the state in a step of its own; full context has the result in its chat
    assert by[("flowstate", task)].subtasks[1].steps == 2
    assert by[("full-context", task)].subtasks[1].steps == 1
    # request 3 needs nothing from earlier requests (its call's arguments are in its query): no disclosure step
    assert by[("flowstate", task)].subtasks[2].steps == by[("full-context", task)].subtasks[2].steps == 3
    tokens = {s: sum(x.usage.prompt_tokens for x in by[(s, task)].subtasks) for s in ("flowstate", "full-context")}
    assert tokens["flowstate"] != tokens["full-context"]  # the memory work differs; the actions do not


def test_a_call_that_is_not_the_recorded_one_fails_the_replay(recording: Path) -> None:
    from flowstate.eval.replay import generate

    task = generate(recording, 1)[0]
    assert isinstance(task, ReplayTask)
    env = task.new_env()
    tools = task.tools(env)
    assert "think" in tools and "book_reservation" in tools  # τ³ airline's tools and τ-bench's think
    result, error = tools.call("get_user_details", {"user_id": "mia_li_3668"})
    assert error is None and result["membership"] == "gold"
    _, error = tools.call("get_user_details", {"user_id": "someone_else"})
    assert error is not None and "not the recorded call" in error
    assert not task.check(1, task.turns[0].answer, env).correct


def test_tau_replay_needs_its_file_and_a_policy(tmp_path: Path, recording: Path) -> None:
    with pytest.raises(ValueError, match="needs --replay FILE"):
        run_eval(EvalConfig(suites=("tau-replay",), strategies=("flowstate",), tasks=1, depth=1, out=tmp_path / "a",
                            policy="realistic"), [])
    for policy in (None, "oracle", "memoryless"):  # its replay policy is the realistic kind, and says so
        with pytest.raises(ValueError, match="give --policy realistic"):
            run_eval(EvalConfig(suites=("tau-replay",), strategies=("flowstate",), tasks=1, depth=1,
                                out=tmp_path / "b", replay=str(recording), policy=policy), [])


def test_a_recorded_state_cites_its_result_where_psa_can_show_it_and_copies_it_where_not() -> None:
    from flowstate.eval.replay import ReplayPolicy, ReplayTask
    from flowstate.limits import STANDARD
    from flowstate.memory import get

    policy, turns = parse(conversation("mia_li_3668", "ABC123"))
    result = {"user_id": "mia_li_3668", "name": {"first_name": "Mia", "last_name": "Li"}, "zip": "78750",
              "reservations": ["ABC123", "Z9Y8X7"], "membership": "gold", "origin": "JFK",
              "payment": {"amount": 250, "source": "certificate"}, "notes": ["x" * 5000]}
    observation = {"observation_id": "obs_r1_s1_1", "tool": "get_user_details", "arguments": {"user_id": "mia_li_3668"},
                   "result": result}
    [cited] = ReplayPolicy(ReplayTask("t", policy, turns), get("flowstate")).record([observation])
    assert cited["summary"] == "get_user_details mia_li_3668: mia_li_3668, 78750, ABC123, Z9Y8X7"  # the ids it holds
    # ids, codes, amounts and statuses, nested as they came; names and prose stay in the result it cites
    assert cited["value"] == {"user_id": "mia_li_3668", "zip": "78750", "reservations": ["ABC123", "Z9Y8X7"],
                              "membership": "gold", "origin": "JFK", "payment": {"amount": 250}}
    assert cited["refs"] == [{"rel": "supports", "state_id": "obs_r1_s1_1"}]
    [copied] = ReplayPolicy(ReplayTask("t", policy, turns), get("no-psa")).record([observation])  # no PSA: it copies
    assert copied["value"]["name"] == {"first_name": "Mia", "last_name": "Li"}
    assert len(copied["value"]["notes"][0]) == STANDARD.value_text  # cut to what a value may hold


def name_conversation() -> list[dict[str, Any]]:
    """Request 2's call needs the passenger's name, which request 1's result held and a citing state leaves out."""
    return [
        {"role": "system", "content": "# Airline Agent Policy"},
        {"role": "user", "content": "Hi, I am mia_li_3668. Who is on reservation ABC123?"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_reservation_details",
                                                                   reservation_id="ABC123")]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_reservation_details",
         "content": json.dumps({"reservation_id": "ABC123",
                                "passengers": [{"first_name": "Noah", "last_name": "Park"}]})},
        {"role": "assistant", "content": "Noah Park is on ABC123."},
        {"role": "user", "content": "Please add the same passenger to reservation XYZ789."},
        {"role": "assistant", "content": None, "tool_calls": [call(
            "c2", "update_reservation_passengers", reservation_id="XYZ789",
            passengers=[{"first_name": "Noah", "last_name": "Park", "dob": "1990-01-01"}])]},
        {"role": "tool", "tool_call_id": "c2", "name": "update_reservation_passengers", "content": "{}"},
        {"role": "assistant", "content": "Done."},
    ]


def test_a_value_the_state_left_out_is_disclosed_from_the_result_it_cites(tmp_path: Path) -> None:
    path = tmp_path / "names.json"
    path.write_text(json.dumps([{"task_id": 0, "traj": name_conversation()}]))
    config = EvalConfig(suites=("tau-replay",), strategies=("flowstate", "full-context"), tasks=1, depth=1,
                        out=tmp_path / "ev", policy="realistic", replay=str(path))
    rows = {r.strategy: r for r in run_eval(config, [])}
    assert rows["flowstate"].success and rows["full-context"].success
    second = rows["flowstate"].subtasks[1]
    # the index names the state, not the name: it asks for the state, then for the result the state cites
    assert second.disclosure_steps == 2 and second.steps == 4
    assert rows["full-context"].subtasks[1].steps == 2


def test_a_value_it_cannot_bring_into_view_fails_the_request_as_a_memory_miss(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from flowstate.eval import replay

    monkeypatch.setattr(replay, "LOOKS", 1)  # one look: the state, without the name; then it gives up
    path = tmp_path / "names.json"
    path.write_text(json.dumps([{"task_id": 0, "traj": name_conversation()}]))
    config = EvalConfig(suites=("tau-replay",), strategies=("flowstate",), tasks=1, depth=1, out=tmp_path / "ev",
                        policy="realistic", replay=str(path))
    [row] = run_eval(config, [])
    assert not row.success and row.subtasks[0].correct
    assert row.subtasks[1].response == f"{replay.MISS} Noah" and not row.subtasks[1].correct


def test_the_report_gives_what_a_gpu_pays_beside_tokens(recording: Path, tmp_path: Path) -> None:
    from flowstate.eval.report import write_report

    config = EvalConfig(suites=("tau-replay",), strategies=("flowstate", "full-context"), tasks=2, depth=1,
                        out=tmp_path / "ev", policy="realistic", replay=str(recording), decode_weight=3)
    summary = write_report(run_eval(config, []), config)
    by = {p["strategy"]: p for p in summary["pairs"]}
    for p in by.values():  # the system message is every session's: a shared prefix cache serves it on first calls
        assert 0 < p["gpu"]["shared_uncached_per_task"] < p["cost"]["uncached_prompt_tokens_per_task"]
        assert p["gpu"]["decoded_per_task"] == p["cost"]["completion_tokens_per_task"]  # nothing forced here
        assert p["gpu"]["pet_per_task"] > p["gpu"]["shared_uncached_per_task"] + 3 * p["gpu"]["decoded_per_task"]
    assert by["flowstate"]["gpu"]["disclosure_steps_per_task"] == 1 and by["full-context"]["gpu"][
        "disclosure_steps_per_task"] == 0
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "PET ×FC" in report and "w = 3 (given)" in report


def test_sessions_join_recorded_conversations_and_results_enlarge_search_pages(recording: Path) -> None:
    from flowstate.eval.suites import Spec, generate, options

    assert options("tau-replay") == {"sessions": 1, "results": 1}
    # 2 conversations: 1 session
    [joined] = generate("tau-replay", 5, Spec(1, sizes={"sessions": 2}, data=str(recording)))
    single = generate("tau-replay", 5, Spec(1, data=str(recording)))
    assert len(single) == 2 and joined.queries == single[0].queries + single[1].queries
    assert isinstance(joined, ReplayTask) and len(joined.expected) == 10
    [big] = generate("tau-replay", 1, Spec(1, sizes={"results": 3}, data=str(recording)))
    assert isinstance(big, ReplayTask)
    flights = big.turns[0].steps[1][0].result["flights"]
    # the recorded item first, then copies with other ids; lists of plain values (reservation ids) stay as they are
    assert flights == [{"flight_number": "HAT001"}, {"flight_number": "HAT001-1"}, {"flight_number": "HAT001-2"}]
    assert big.turns[0].steps[0][0].result["reservations"] == ["ABC123"]
    with pytest.raises(ValueError, match="at least 1"):
        generate("tau-replay", 1, Spec(1, sizes={"sessions": 0}, data=str(recording)))


def test_a_joined_session_replays_through_every_strategy(recording: Path, tmp_path: Path) -> None:
    config = EvalConfig(suites=("tau-replay",), strategies=("flowstate", "full-context", "flowstate-paged"), tasks=1,
                        depth=1, out=tmp_path / "ev", policy="realistic", replay=str(recording),
                        sizes={"sessions": 2, "results": 2})
    rows = run_eval(config, [])
    assert [r.success for r in rows] == [True, True, True] and all(len(r.subtasks) == 6 for r in rows)


def run_replay(recording: Path, tmp_path: Path, strategy: Any) -> tuple[list[bool], list[str | None], list[Any]]:
    """One recorded conversation through ``strategy`` with the replay policy: each request's success, response, and
    the engine's prompts."""
    from flowstate import Agent, Repository
    from flowstate.config import LoopConfig
    from flowstate.eval.policies import PolicyEngine
    from flowstate.eval.replay import ReplayPolicy, generate

    task = generate(recording, 1)[0]
    env = task.new_env()
    prompts: list[Any] = []
    policy = ReplayPolicy(task, strategy)
    engine = PolicyEngine(lambda messages, purpose: prompts.append(list(messages)) or policy(messages, purpose))
    solved, responses = [], []
    with Repository.open(tmp_path / f"{strategy.name}.db") as repo:
        agent = Agent(engine, repository=repo, session="s", tools=task.tools(env), task_policy=task.policy,
                      strategy=strategy, config=LoopConfig(max_steps=40))
        for k, query in enumerate(task.queries, start=1):
            response = agent.run(query).response
            responses.append(response)
            solved.append(task.check(k, response, env).correct)
    return solved, responses, prompts


def test_a_method_that_cannot_show_an_earlier_value_fails_as_a_memory_miss(recording: Path, tmp_path: Path) -> None:
    """Request 2's answer repeats HAT001 from request 1's result: a method whose prompt shows nothing of earlier
    requests cannot act on it — the request ends as a memory miss, and the task fails."""
    from dataclasses import dataclass

    from engine.base import Message
    from flowstate.eval.replay import MISS
    from flowstate.memory.base import StepInput
    from flowstate.memory.chat import ChatHistory
    from flowstate.serializer import layout

    @dataclass(frozen=True)
    class Blind(ChatHistory):  # full context's protocol, but its prompt keeps only this request
        name: str = "blind"

        def prompt(self, step: StepInput) -> list[Message]:
            user = layout(step.query, memory=None, state=None, trajectory=step.trajectory, observation=step.observation)
            return [Message("system", step.system), Message("user", user)]

    solved, responses, _ = run_replay(recording, tmp_path, Blind())
    assert solved[0] and not solved[1] and (responses[1] or "").startswith(MISS) and "HAT001" in (responses[1] or "")
    solved, _, _ = run_replay(recording, tmp_path, get("full-context"))
    assert all(solved)  # the same conversation, every value in view


def test_the_state_tracker_is_answered_with_what_it_tracks(recording: Path, tmp_path: Path) -> None:
    """ZipAct's tracker keeps each result's key values in its world (as a citing state keeps them), so request 2
    sees HAT001 in the tracked state and answers without a miss."""
    solved, _, prompts = run_replay(recording, tmp_path, get("zipact"))
    agent_prompts = [p for p in prompts if not p[0].content.startswith("<track_state>")]
    request2 = next(p for p in agent_prompts if "Which flight was on reservation" in p[-1].content)
    assert all(solved) and "HAT001" in request2[-1].content.split("</tracked_state>")[0]
