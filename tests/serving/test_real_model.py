"""The endpoint on the embedded model (llama.cpp + SmolLM2-135M-Instruct under the step grammar)."""

from __future__ import annotations

import pytest

from tests.serving.conftest import Server
from tests.serving.test_chat import client

pytestmark = pytest.mark.slow


def test_embedded_model_answers_over_http_and_the_turn_is_stored(server: Server) -> None:
    url = server.start(None, "--max-tokens", "1024", "--max-steps", "3")
    api = client(url)
    messages: list = [{"role": "system", "content": "Answer in one short sentence."},
                      {"role": "user", "content": "Say hello to Ada."}]
    r = api.chat.completions.create(model="flowstate", user="real", messages=messages)
    ext = r.model_extra["flowstate"]
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content
    # the grammar keeps every step parsable: a step that does not parse is one the completion budget cut
    # (the compact profile admits outputs longer than --max-tokens), recorded as such
    assert all("protocol_error" not in s or s.get("truncated") for s in ext["steps"]), ext["steps"]
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    stored = api.get("/sessions/real", cast_to=object)["requests"]
    assert stored[0]["query"] == "Say hello to Ada."
    # under the grammar the last allowed step must answer: the request ends answered, whatever the model does
    assert stored[0]["unfinished"] is None and ext["unfinished"] is None
    assert stored[0]["response"] == r.choices[0].message.content
    # the next turn streamed: under the grammar the answer arrives token by token as it is decoded
    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "Now say goodbye to Ada."}]
    chunks = list(api.chat.completions.create(model="flowstate", user="real", messages=messages, stream=True,
                                              stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    final = api.get("/sessions/real", cast_to=object)["requests"][1]
    assert final["unfinished"] is None and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert "".join(pieces) == final["response"] and len(pieces) > 1
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details.cached_tokens > 0  # the first turn's prefix, reused
