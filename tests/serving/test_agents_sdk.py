"""The OpenAI Agents SDK (its default, the Responses API) against a real FlowState server on the scripted engine:
``Runner.run`` and ``Runner.run_streamed`` with a ``@function_tool`` — the SDK resends the whole history each turn
and FlowState runs only what is new — and ``previous_response_id`` chaining. Tracing is off; no key is needed."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.serving.conftest import Server
from tests.serving.test_responses import round_trip

agents = pytest.importorskip("agents")


def agent_for(url: str) -> Any:
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_price(hotel: str) -> str:
        """Price per night of a hotel."""
        return '{"price": 120}'

    model = agents.OpenAIResponsesModel(model="flowstate",
                                        openai_client=AsyncOpenAI(base_url=url, api_key="none", max_retries=0))
    return agents.Agent(name="hotels", instructions="You help with hotel bookings.", model=model, tools=[get_price])


def one_session_of_two_requests(url: str) -> bool:
    """What the server stored: one session holding the two requests (a resent history is not a new request)."""
    return [s["requests"] for s in httpx.get(url + "/sessions").json()["data"]] == [2]


def test_runner_run_with_a_function_tool_then_memory(server: Server) -> None:
    url = server.start(round_trip("[a1]"))
    agent = agent_for(url)

    async def turns() -> tuple[Any, Any]:
        first = await agents.Runner.run(agent, "[a1] What does hotel A cost?")
        # the next turn chained by previous_response_id: only the new message is sent, memory answers it
        later = await agents.Runner.run(agent, "[a1] Remind me: what did hotel A cost?",
                                        previous_response_id=first.last_response_id)
        return first, later

    first, later = asyncio.run(turns())
    assert first.final_output == "Hotel A costs 120 per night."
    calls = [i for i in first.new_items if i.type == "tool_call_item"]
    assert len(calls) == 1 and calls[0].raw_item.name == "get_price"
    assert later.final_output == "It cost 120 per night."
    assert one_session_of_two_requests(url)


def test_runner_run_streamed_with_the_whole_history_resent(server: Server) -> None:
    url = server.start(round_trip("[a2]"))
    agent = agent_for(url)

    async def run(items: Any) -> Any:
        result = agents.Runner.run_streamed(agent, items)
        kinds = [e.type async for e in result.stream_events()]
        assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
        return result

    async def turns() -> tuple[Any, Any]:
        first = await run("[a2] What does hotel A cost?")
        history = first.to_input_list() + [{"role": "user", "content": "[a2] Remind me: what did hotel A cost?"}]
        return first, await run(history)  # the SDK's default: everything resent, echoed calls and results included

    first, later = asyncio.run(turns())
    assert first.final_output == "Hotel A costs 120 per night."
    assert later.final_output == "It cost 120 per night."
    assert one_session_of_two_requests(url)
