"""An agent harness that talks LiteLLM (``openai/<model>`` with an ``api_base``) works unchanged."""

from __future__ import annotations

import json
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm

from tests.serving.conftest import Server
from tests.serving.test_chat import PRICE_TOOL, round_trip_script


def test_litellm_tool_loop(server: Server) -> None:
    url = server.start(round_trip_script("[l]"))
    messages: list[Any] = [{"role": "user", "content": "[l] What does hotel A cost?"}]
    answers = []
    while len(answers) < 2:  # a generic tool loop, as harnesses write it
        # LiteLLM drops `user` for openai/<model> names it does not know: the session is named through extra_body
        r = litellm.completion(model="openai/flowstate", api_base=url, api_key="none", messages=messages,
                               tools=[PRICE_TOOL], extra_body={"user": "lite"})
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if msg.tool_calls:
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": json.dumps({"price": 120, **json.loads(call.function.arguments)})})
            continue
        answers.append(msg.content)
        messages.append({"role": "user", "content": "[l] Remind me: what did hotel A cost?"})
    assert answers == ["Hotel A costs 120 per night.", "It cost 120 per night."]
    assert r.usage.prompt_tokens > 0
    import httpx

    session = httpx.get(url + "/sessions/lite").json()
    assert [q["index"] for q in session["requests"]] == [1, 2]
