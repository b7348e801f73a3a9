"""The endpoint on the embedded model (transformers + SmolLM2-135M-Instruct under the step grammar)."""

from __future__ import annotations

import pytest

from tests.serving.conftest import Server
from tests.serving.test_chat import client

pytestmark = pytest.mark.slow


def test_embedded_model_answers_over_http_and_the_turn_is_stored(server: Server) -> None:
    url = server.start(None, "--max-tokens", "160", "--max-steps", "3")
    api = client(url)
    r = api.chat.completions.create(
        model="flowstate", user="real",
        messages=[{"role": "system", "content": "Answer in one short sentence."},
                  {"role": "user", "content": "Say hello to Ada."}],
    )
    ext = r.model_extra["flowstate"]
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content
    assert all("protocol_error" not in s for s in ext["steps"])  # the grammar keeps every step parsable
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    if ext["model_calls"] > 1:
        assert r.usage.prompt_tokens_details.cached_tokens > 0  # KV prefix reuse across the turn's steps
    stored = api.get("/sessions/real", cast_to=object)
    assert [(q["query"], q["response"]) for q in stored["requests"]] == [("Say hello to Ada.", r.choices[0].message.content)]
