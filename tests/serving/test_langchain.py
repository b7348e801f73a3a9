"""LangChain's ``ChatOpenAI(use_responses_api=True)`` against a real FlowState server on the scripted engine: a
``bind_tools`` round trip (LangChain resends the whole history), a streamed answer, and the next turn that
FlowState's memory answers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.serving.conftest import Server
from tests.serving.test_responses import PRICE_TOOL, round_trip

pytest.importorskip("langchain_openai")


def test_chat_openai_on_responses_with_bind_tools(server: Server) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    url = server.start(round_trip("[l1]"))
    llm = ChatOpenAI(model="flowstate", base_url=url, api_key="none", use_responses_api=True, max_retries=0)
    tool = {k: PRICE_TOOL[k] for k in ("name", "description", "parameters")}
    bound = llm.bind_tools([{"type": "function", "function": tool}])
    history: list[Any] = [HumanMessage("[l1] What does hotel A cost?")]
    call = bound.invoke(history)
    assert [(c["name"], c["args"]) for c in call.tool_calls] == [("get_price", {"hotel": "A"})]
    history += [call, ToolMessage('{"price": 120}', tool_call_id=call.tool_calls[0]["id"])]
    pieces = list(bound.stream(history))  # the answer, streamed through the Responses events
    answer = pieces[0]
    for piece in pieces[1:]:
        answer += piece
    assert answer.text == "Hotel A costs 120 per night."
    history += [answer, HumanMessage("[l1] Remind me: what did hotel A cost?")]
    assert bound.invoke(history).text == "It cost 120 per night."
    # one session, two requests: the resent history was recognised each time
    assert [s["requests"] for s in httpx.get(url + "/sessions").json()["data"]] == [2]
