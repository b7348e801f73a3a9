"""Each request parameter reaches the engine (the official openai client against the app in process, on a
recording scripted engine), what an engine cannot honour is a 400, and a failed turn moves the counters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from engine.base import Capabilities
from engine.scripted import ScriptedEngine
from flowstate import LoopConfig, Repository
from flowstate.request_options import RequestOptions
from serving.app import create_app
from serving.services import ServerConfig
from tests.helpers import output
from tests.serving.test_chat import PRICE_TOOL


@pytest.fixture
def served() -> Iterator[tuple[openai.OpenAI, ScriptedEngine, TestClient]]:
    engine = ScriptedEngine([output(content="Hotel A. Then B.")] * 5 + ["broken"] * 3)
    with Repository.open(":memory:") as repo:
        app = create_app(ServerConfig(engine=engine, repo=repo, loop=LoopConfig(max_protocol_errors=3)))
        with TestClient(app, base_url="http://flowstate.test") as http:
            yield openai.OpenAI(base_url="http://flowstate.test/v1", api_key="none", http_client=http,
                                max_retries=0), engine, http


def test_sampling_budget_and_stop_reach_the_engine(served: Any) -> None:
    api, engine, _ = served
    r = api.chat.completions.create(model="flowstate", user="p", messages=[{"role": "user", "content": "q"}],
                                    temperature=0.7, top_p=0.9, seed=42, max_completion_tokens=77, stop=[". "])
    assert r.choices[0].message.content == "Hotel A"  # cut before the stop sequence
    call = engine.calls[-1]
    assert call["max_tokens"] is None and call["sampling"].temperature == 0.7  # the budget is the answer's (below)
    assert call["sampling"].top_p == 0.9 and call["sampling"].seed == 42
    api.chat.completions.create(model="flowstate", user="p2", messages=[{"role": "user", "content": "q"}], max_tokens=5)
    assert engine.calls[-1]["sampling"] is None


def test_max_tokens_bounds_the_answer_the_client_receives_not_the_protocols_steps() -> None:
    answer = "Hotel A costs 120 a night and Hotel B costs 95 a night."
    engine = ScriptedEngine([output(content=answer)] * 5)
    with Repository.open(":memory:") as repo:
        app = create_app(ServerConfig(engine=engine, repo=repo, loop=LoopConfig(max_tokens=900)))
        with TestClient(app, base_url="http://flowstate.test") as http:
            api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key="none", http_client=http, max_retries=0)
            ask = [{"role": "user", "content": "which hotel?"}]
            whole = api.chat.completions.create(model="flowstate", user="w", messages=ask, max_tokens=500)
            assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (answer, "stop")
            for n in (1, 4, 7):
                cut = api.chat.completions.create(model="flowstate", user=f"c{n}", messages=ask, max_tokens=n)
                text = cut.choices[0].message.content or ""
                assert cut.choices[0].finish_reason == "length" and answer.startswith(text) and text
                assert engine.count_tokens(text) <= n < engine.count_tokens(answer[:len(text) + 1])
                assert engine.calls[-1]["max_tokens"] == 900  # every step decodes under the server's budget
            streamed = api.chat.completions.create(model="flowstate", user="s", messages=ask, max_tokens=4,
                                                   stream=True)
            chunks = list(streamed)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text_at(engine, answer, 4)
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
            memory = api.get("/sessions/c4", cast_to=object)
            assert memory["requests"][0]["response"] == answer  # memory keeps the whole answer
            for bad in (0, -1):
                refused = http.post("/v1/chat/completions", json={"model": "flowstate", "messages": ask,
                                                                  "max_tokens": bad})
                assert refused.status_code in (400, 422) and "max_tokens" in refused.text
                assert "greater than or equal to 1" in refused.text


def text_at(engine: ScriptedEngine, answer: str, n: int) -> str:
    return RequestOptions(answer_tokens=n).fit(answer, engine.count_tokens)[0]


@pytest.mark.parametrize(("params", "fragment"), [
    ({"temperature": 3}, "temperature"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [PRICE_TOOL]}, "not among"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "not a valid JSON Schema"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
def test_what_cannot_be_asked_is_a_400(served: Any, params: dict[str, Any], fragment: str) -> None:
    api, _, _ = served
    with pytest.raises(openai.BadRequestError, match=fragment):
        api.chat.completions.create(model="flowstate", user="bad", messages=[{"role": "user", "content": "q"}],
                                    **params)


def test_an_engine_that_cannot_honour_a_parameter_says_so() -> None:
    class NoSampling(ScriptedEngine):
        capabilities = Capabilities()

    with Repository.open(":memory:") as repo:
        app = create_app(ServerConfig(engine=NoSampling([output(content="x")]), repo=repo))
        with TestClient(app, base_url="http://flowstate.test") as http:
            api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key="none", http_client=http, max_retries=0)
            with pytest.raises(openai.BadRequestError, match="cannot honour seed per request"):
                api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "q"}], seed=1)


def test_a_failed_turn_moves_the_counters_and_lists_its_step_errors(served: Any) -> None:
    api, engine, http = served
    for _ in range(5):
        engine.generate([])  # use up the good outputs: the next turn gets three broken ones
    with pytest.raises(openai.APIStatusError) as info:
        api.chat.completions.create(model="flowstate", user="f", messages=[{"role": "user", "content": "q"}])
    assert info.value.status_code == 502
    assert ("Step errors: step 1: state_focus: missing <state_focus>" in info.value.message
            and "step 3:" in info.value.message)
    metrics = {line.split()[0]: float(line.split()[1]) for line in http.get("/metrics").text.splitlines()
               if line and not line.startswith("#")}
    assert metrics['flowstate_turns_total{outcome="request_failed"}'] == 1
    assert metrics["flowstate_model_calls_total"] == 3 and metrics["flowstate_protocol_errors_total"] == 3
    assert metrics["flowstate_prompt_tokens_total"] > 0


def test_a_json_schema_answer_arrives_as_json() -> None:
    engine = ScriptedEngine([output(content="X").replace('{"content": "X"}', '{"content": {"hotel": "A"}}')])
    schema = {"type": "object", "properties": {"hotel": {"type": "string"}}, "required": ["hotel"]}
    with Repository.open(":memory:") as repo:
        app = create_app(ServerConfig(engine=engine, repo=repo))
        with TestClient(app, base_url="http://flowstate.test") as http:
            api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key="none", http_client=http, max_retries=0)
            r = api.chat.completions.create(
                model="flowstate", user="j", messages=[{"role": "user", "content": "which?"}],
                response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}})
    assert json.loads(r.choices[0].message.content or "") == {"hotel": "A"}
    assert "matching this JSON Schema" in engine.prompts[-1][0].content  # the model is told the format


@pytest.mark.parametrize("budget", [3, 40, 400, 5000])
def test_a_streamed_answer_under_max_tokens_is_counted_in_linear_work_and_cut_exactly(budget: int) -> None:
    """The answer streams in pieces; each piece is no longer checked by counting the whole answer so far (quadratic
    in its length), only near the budget — and what the client receives is still exactly the longest prefix that
    fits, as the final answer is cut."""
    from types import SimpleNamespace

    from flowstate.protocol import ModelOutput, render_output
    from serving.turns import Turns

    engine = ScriptedEngine([])
    answer = " ".join(f"word{i} costs {i * 7} a night," for i in range(400))  # ~2,400 tokens, 12,000 characters
    counted: list[int] = []

    def count(text: str) -> int:
        counted.append(len(text))
        return engine.count_tokens(text)

    run = SimpleNamespace(client_tools=set(), options=RequestOptions(answer_tokens=budget))
    got: list[str] = []
    feed = Turns._live_output(run, 1, lambda d: got.append(d.content or ""), count)  # type: ignore[arg-type]
    raw = render_output(ModelOutput.model_validate({"assistant_message": {"content": answer}}))
    for i in range(0, len(raw), 5):
        feed(raw[i:i + 5])
    assert "".join(got) == RequestOptions(answer_tokens=budget).fit(answer, engine.count_tokens)[0]
    assert sum(counted) < 12 * len(answer)  # linear (the whole answer re-counted per piece: ~700 times its length)
