"""What an adversarial probe of `flowstate serve` found, each reproduced against a real server: sessions
that fork instead of sharing, resends that do not store a turn twice, failures by fault, the schema behind
the key, a waiting request that can be read, refusals before a stream starts, clients that go away or
dawdle, and one session's turns under eviction pressure."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import output
from tests.serving.conftest import Server, lines
from tests.serving.test_chat import PRICE_TOOL, client, round_trip_script


def test_conversations_that_open_alike_never_share_a_session(server: Server) -> None:
    opening: list[Any] = [{"role": "system", "content": "You are an airline agent."},
                          {"role": "user", "content": "[fork] I want to change my flight."}]
    script = lines("[fork]", [output(content="Which booking?")] * 2)
    script += lines("[one]",
                    [output(content="Booking ONE changed.")]) + lines("[two]", [output(content="Booking TWO changed.")])
    api = client(server.start(script))
    first = api.chat.completions.create(model="flowstate", messages=opening)
    second = api.chat.completions.create(model="flowstate", messages=opening)  # trial 2 of the same task
    name1, name2 = first.model_extra["flowstate"]["session"], second.model_extra["flowstate"]["session"]
    assert name1 != name2 and name1.startswith("fp-") and name2 == name1 + ".1"
    for answer, tag, name in ((first, "one", name1), (second, "two", name2)):
        history = [*opening, {"role": "assistant", "content": answer.choices[0].message.content},
                   {"role": "user", "content": f"[{tag}] Booking {tag.upper()}."}]
        r = api.chat.completions.create(model="flowstate", messages=history)
        assert r.choices[0].message.content == f"Booking {tag.upper()} changed."
        assert r.model_extra["flowstate"]["session"] == name and r.model_extra["flowstate"]["request"] == 2


def test_an_exact_resend_and_an_idempotency_key_replay_the_answer(server: Server) -> None:
    script = lines("[r]", [output(content="first answer"), output(content="second answer"), output(content="third")])
    api = client(server.start(script))
    history: list[Any] = [{"role": "user", "content": "[r] one"}]
    r1 = api.chat.completions.create(model="flowstate", messages=history, user="resend")
    history += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "[r] two"}]
    r2 = api.chat.completions.create(model="flowstate", messages=history, user="resend")
    again = api.chat.completions.create(model="flowstate", messages=history, user="resend")  # response lost, resent
    assert r2.choices[0].message.content == again.choices[0].message.content == "second answer"
    assert again.model_extra["flowstate"]["replayed"] and again.usage.prompt_tokens == 0
    # a client that sends only new messages names its retries with an Idempotency-Key
    new_only: list[Any] = [{"role": "user", "content": "[r] three"}]
    headers = {"Idempotency-Key": "turn-3"}
    r3 = api.chat.completions.create(model="flowstate", messages=new_only, user="resend", extra_headers=headers)
    r3b = api.chat.completions.create(model="flowstate", messages=new_only, user="resend", extra_headers=headers)
    assert r3.choices[0].message.content == r3b.choices[0].message.content == "third"
    session = api.get("/sessions/resend", cast_to=object)
    assert [q["query"] for q in session["requests"]] == ["[r] one", "[r] two", "[r] three"]  # each turn stored once
    server.stop()  # the key survives a restart: it is stored with its request
    api = client(server.start(lines("[r]", [output(content="never used")])))
    r3c = api.chat.completions.create(model="flowstate", messages=new_only, user="resend", extra_headers=headers)
    assert r3c.choices[0].message.content == "third" and r3c.model_extra["flowstate"]["replayed"]
    # the same key on a different request is refused, not answered with the first request's reply
    with pytest.raises(openai.UnprocessableEntityError) as reused:
        api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[r] four"}],
                                    user="resend",
                                    extra_headers=headers)
    assert reused.value.body["code"] == "idempotency_key_reused"  # type: ignore[index]
    session = api.get("/sessions/resend", cast_to=object)
    assert [q["query"] for q in session["requests"]] == ["[r] one", "[r] two", "[r] three"]  # nothing stored


def test_an_unreachable_engine_is_a_503_with_retry_after(server: Server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens here once the socket closes
    url = server.start(None, "--engine", "openai", "--base-url", f"http://127.0.0.1:{dead}/v1", "--model", "m")
    resp = httpx.post(url + "/chat/completions", timeout=60,
                      json={"model": "flowstate", "user": "u", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 503 and resp.headers["retry-after"] == "5"
    assert resp.json()["error"]["code"] == "engine_unavailable"
    assert httpx.get(url + "/sessions/u").status_code == 404  # nothing stored


def test_a_prompt_past_the_models_context_is_a_400_that_says_resending_cannot_help(server: Server) -> None:
    url = server.start(None, "--engine", "llamacpp")  # the embedded model: an 8,192-token context
    long = " ".join(f"word{i}" for i in range(9000))
    resp = httpx.post(url + "/chat/completions", timeout=120,
                      json={"model": "flowstate", "user": "long", "messages": [{"role": "user", "content": long}]})
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["code"] == "context_length_exceeded", error
    assert "resending cannot help" in error["message"] and "8192" in error["message"]
    assert httpx.get(url + "/sessions/long").status_code == 404  # the first call failed: nothing stored


def test_the_schema_needs_a_key_like_every_endpoint_but_health(server: Server) -> None:
    url = server.start(lines("[s]", [output(content="x")]), "--api-key", "sk-a")
    root = url.removesuffix("/v1")
    assert httpx.get(root + "/openapi.json").status_code == 401
    assert httpx.get(root + "/docs").status_code == 401  # no key: nothing said of which paths exist
    assert httpx.get(root + "/docs", headers={"Authorization": "Bearer sk-a"}).status_code == 404
    schema = httpx.get(root + "/openapi.json", headers={"Authorization": "Bearer sk-a"}).json()
    assert "/v1/chat/completions" in schema["paths"]
    # the chat and responses requests are documented from the wire models the routes validate with
    for path, model in (("/v1/chat/completions", "ChatRequest"), ("/v1/responses", "ResponsesRequest")):
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
    chat = schema["components"]["schemas"]["ChatRequest"]
    assert {"model", "messages"} <= set(chat["required"]) and "tools" in chat["properties"]
    assert chat["properties"]["messages"]["items"]["$ref"].removeprefix("#/components/schemas/") in \
        schema["components"]["schemas"]  # every reference resolves in the document


def test_a_request_waiting_on_tool_results_can_be_read_and_a_clash_is_refused_before_streaming(server: Server) -> None:
    url = server.start(round_trip_script("[w]"), "--tools", "tests.serving.test_adversarial:SERVER_TOOLS")
    api = client(url)
    r = api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[w] price?"}],
                                    tools=[PRICE_TOOL], user="waiting")
    assert r.choices[0].finish_reason == "tool_calls"
    session = api.get("/sessions/waiting", cast_to=object)
    assert session["requests"] == []
    assert session["pending"] == {"tool_call_ids": [r.choices[0].message.tool_calls[0].id]}
    clash: Any = {"type": "function",
                  "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError, match="already server-side tools"):
        api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "x"}], tools=[clash],
                                    user="other", stream=True)


def weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


SERVER_TOOLS = [weather]


def test_clients_that_go_away_or_dawdle_get_no_traceback_and_no_held_slot(server: Server) -> None:
    url = server.start(lines("[s]", [output(content="x")]), "--body-timeout", "1")
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{\"model\": ").encode()
    with socket.create_connection((host, int(port))) as abandoned:
        abandoned.sendall(head)  # then goes away mid-body
    with socket.create_connection((host, int(port))) as slow:
        slow.sendall(head)
        slow.settimeout(10)
        started = time.monotonic()
        answer = slow.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408") and time.monotonic() - started < 5
    time.sleep(0.5)
    log = server.log.read_text()
    assert "Traceback" not in log and "internal error" not in log
    server.stop()
    url = server.start(lines("[s]", [output(content="x")]), "--header-timeout", "1")
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    with socket.create_connection((host, int(port))) as slowloris:  # one header byte at a time, never done
        slowloris.settimeout(10)
        started = time.monotonic()
        answer = b""
        for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n":
            try:
                slowloris.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.2)
            if time.monotonic() - started > 3:
                break
        try:
            answer = slowloris.recv(4096)
        except OSError:
            pass
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200  # and everyone else is served


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
def test_one_sessions_turns_stay_serialized_under_eviction_pressure(server: Server) -> None:
    script = lines("[e]", [output(content=f"answer {i}") for i in range(6)])
    url = server.start(script, "--max-live-sessions", "2", "--api-key", "sk-a", "--api-key", "sk-b")
    a, b = client(url, "sk-a"), client(url, "sk-b")

    def turn(i: int) -> str:
        r = a.chat.completions.create(model="flowstate", user="victim",
                                      messages=[{"role": "user", "content": f"[e] q{i}"}])
        return str(r.choices[0].message.content)

    def noise(i: int) -> int:  # another tenant's cheap refusals push sessions through memory
        resp = httpx.post(url + "/chat/completions", headers={"Authorization": "Bearer sk-b"},
                          json={"model": "flowstate", "user": f"n{i}",
                                "messages": [{"role": "tool", "tool_call_id": "x", "content": "1"}]})
        return resp.status_code

    with ThreadPoolExecutor(12) as pool:
        turns = [pool.submit(turn, i) for i in range(6)]
        codes = list(pool.map(noise, range(300)))
        answers = sorted(f.result() for f in turns)
    assert set(codes) == {400} and answers == [f"answer {i}" for i in range(6)]
    session = a.get("/sessions/victim", cast_to=object)
    assert [r["index"] for r in session["requests"]] == [1, 2, 3, 4, 5, 6]
    assert sorted(r["query"] for r in session["requests"]) == [f"[e] q{i}" for i in range(6)]
    assert b.get("/sessions", cast_to=object)["data"] == []


def test_the_answer_streams_token_by_token(server: Server) -> None:
    answer = 'Hotel A costs 120 per night; "quiet" rooms — ☃.'
    script = lines("[t]", [output(content=answer)] * 3)
    api = client(server.start(script, "--stream-answers", "always"))
    chunks = list(api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[t] price?"}],
                                              user="tok", stream=True))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == answer and len(pieces) > 5  # many deltas, not one piece at the end
    assert chunks[-1].choices[0].finish_reason == "stop"
    stopped = list(api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[t] again?"}],
                                               user="tok3", stream=True, stop=["per ni"]))
    pieces = [c.choices[0].delta.content for c in stopped if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == "Hotel A costs 120 "  # a stream never passes a stop sequence
    server.stop()
    api = client(server.start(script, "--stream-answers", "never"))
    chunks = list(api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[t] again"}],
                                              user="tok2", stream=True))
    assert [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content] == [answer]


def test_client_tool_calls_stream_as_they_are_decoded(server: Server) -> None:
    api = client(server.start(round_trip_script("[c]"), "--stream-answers", "always"))
    chunks = list(api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[c] price?"}],
                                              tools=[PRICE_TOOL], user="calls", stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) > 2  # the call's head, then its arguments piece by piece
    head = deltas[0][0]
    assert head.index == 0 and head.id == "call_obs_r1_s1_1" and head.function.name == "get_price"
    arguments = "".join(d[0].function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"hotel": "A"} and chunks[-1].choices[0].finish_reason == "tool_calls"
    r = api.chat.completions.create(model="flowstate", user="calls", tools=[PRICE_TOOL], messages=[
        {"role": "user", "content": "[c] price?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": head.id, "type": "function", "function": {"name": "get_price", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": head.id, "content": '{"price": 120}'}])
    assert r.choices[0].message.content == "Hotel A costs 120 per night."  # the streamed history is recognised


def test_a_harness_that_greets_first_and_runs_several_trials(server: Server) -> None:
    """As tau2-bench's agent loop does: its own canned greeting opens every conversation, the whole history
    is resent each turn, tool calls go round trip, and the same task runs twice without naming sessions."""
    script = lines("[h]", [output(tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]),
                           output(content="Hotel A costs 120 per night.")] * 2)
    api = client(server.start(script))
    sessions = set()
    for _trial in range(2):
        messages: list[Any] = [{"role": "system", "content": "You are a hotel agent."},
                               {"role": "assistant", "content": "Hi! How can I help you today?"},
                               {"role": "user", "content": "[h] What does hotel A cost?"}]
        while True:
            r = api.chat.completions.create(model="flowstate", messages=messages, tools=[PRICE_TOOL])
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"price": 120}'} for c in msg.tool_calls]
        assert msg.content == "Hotel A costs 120 per night."
        sessions.add(r.model_extra["flowstate"]["session"])
        stored = api.get(f"/sessions/{r.model_extra['flowstate']['session']}", cast_to=object)
        assert "Hi! How can I help you today?" in stored["requests"][0]["query"]  # the model saw the greeting
    assert len(sessions) == 2  # two trials, two sessions
