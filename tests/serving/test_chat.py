"""Chat Completions against a real uvicorn server with the official openai client (scripted engine)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.helpers import add, output
from tests.serving.conftest import Server, lines

PRICE_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_price", "description": "Price per night of a hotel.",
        "parameters": {"type": "object", "properties": {"hotel": {"type": "string"}}, "required": ["hotel"]},
    },
}


def round_trip_script(marker: str) -> list[dict[str, Any]]:
    """Turn 1: a client tool call, a state-only step, an answer. Turn 2: access that state, answer."""
    return lines(marker, [
        output(tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]),
        output(delta=[add("price_a", refs=[("supports", "obs_r1_s1_1")], hotel="A", price=120)]),
        output(content="Hotel A costs 120 per night."),
        output(focus=["price_a"]),
        output(content="It cost 120 per night."),
    ])


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


def two_turns(api: openai.OpenAI, session: str, marker: str, *, full_history: bool) -> list[Any]:
    """The client's side of the round trip; returns the four completions."""
    system = {"role": "system", "content": "You help with hotel bookings."}
    history: list[Any] = [system, {"role": "user", "content": f"{marker} What does hotel A cost?"}]
    sent = list(history)
    done = []
    for _ in range(2):
        r = api.chat.completions.create(model="flowstate", messages=sent, tools=[PRICE_TOOL], user=session)
        done.append(r)
        msg = r.choices[0].message
        history.append(msg.model_dump(exclude_none=True))
        new: list[Any] = []
        if r.choices[0].finish_reason == "tool_calls":
            assert msg.tool_calls is not None
            for call in msg.tool_calls:
                args = json.loads(call.function.arguments)
                new.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"price": 120, **args})})
        else:
            new.append({"role": "user", "content": f"{marker} Remind me: what did hotel A cost?"})
        history += new
        sent = history if full_history else new
        if len(done) == 2 and r.choices[0].finish_reason == "stop":
            r = api.chat.completions.create(model="flowstate", messages=sent, tools=[PRICE_TOOL], user=session)
            done.append(r)
    return done


@pytest.mark.parametrize("full_history", [True, False], ids=["full-history", "new-messages-only"])
def test_tool_round_trip_over_two_turns(server: Server, full_history: bool) -> None:
    url = server.start(round_trip_script("[s1]"))
    api = client(url)
    first, answer, second = two_turns(api, "alice", "[s1]", full_history=full_history)

    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name,
            json.loads(call.function.arguments)) == ("call_obs_r1_s1_1", "get_price", {"hotel": "A"})
    assert first.model_extra["flowstate"]["request_finished"] is False

    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content == "Hotel A costs 120 per night."
    ext = answer.model_extra["flowstate"]
    assert ext["model_calls"] == 2 and ext["steps"][0]["committed"] == ["add price_a"]  # the state-only step ran here

    assert second.choices[0].message.content == "It cost 120 per night."
    ext = second.model_extra["flowstate"]
    assert ext["request"] == 2 and ext["disclosed"] == ["price_a"] and ext["rejected"] == []
    assert second.usage.prompt_tokens > 0 and second.usage.prompt_tokens_details.cached_tokens > 0

    stored = api.get("/sessions/alice", cast_to=object)
    assert [r["query"] for r in stored["requests"]] == ["[s1] What does hotel A cost?",
                                                        "[s1] Remind me: what did hotel A cost?"]
    nodes = {n["id"]: n for n in stored["nodes"]}
    assert nodes["price_a"]["relations"] == [{"rel": "supports", "target": "obs_r1_s1_1"}]
    assert nodes["obs_r1_s1_1"]["value"] == {"tool": "get_price", "arguments": {"hotel": "A"},
                                             "result": {"price": 120, "hotel": "A"}}


def test_streaming_and_non_streaming_agree(tmp_path: Any) -> None:
    results: dict[bool, list[tuple[Any, Any, Any]]] = {}
    for stream in (False, True):
        server = Server(tmp_path / f"stream-{stream}")
        server.tmp.mkdir()
        api = client(server.start(round_trip_script("[s]")))
        try:
            messages: list[Any] = [{"role": "user", "content": "[s] What does hotel A cost?"}]
            turns = []
            for _ in range(2):
                if stream:
                    chunks = list(api.chat.completions.create(
                        model="flowstate", messages=messages, tools=[PRICE_TOOL], user="u", stream=True,
                        stream_options={"include_usage": True}))
                    turns.append(_assemble(chunks))
                else:
                    r = api.chat.completions.create(model="flowstate", messages=messages, tools=[PRICE_TOOL], user="u")
                    m = r.choices[0].message
                    calls = [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()]
                    turns.append((m.content, calls, r.choices[0].finish_reason, r.usage.model_dump()))
                if turns[-1][2] == "tool_calls":
                    messages = [{"role": "tool", "tool_call_id": turns[-1][1][0][0], "content": '{"price": 120}'}]
            results[stream] = turns
        finally:
            server.stop()
    assert results[True] == results[False]
    assert results[False][0][2] == "tool_calls" and results[False][1][0] == "Hotel A costs 120 per night."


def _assemble(chunks: list[Any]) -> tuple[Any, ...]:
    content, calls, finish, usage = "", [], None, None
    assert chunks[0].choices[0].delta.role == "assistant"
    for c in chunks:
        if c.usage is not None:
            usage = c.usage.model_dump()
        for choice in c.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                calls.append((call.id, call.function.name, call.function.arguments))
            finish = choice.finish_reason or finish
    return (content or None, calls, finish, usage)


def test_restart_continues_the_session_with_its_memory(server: Server) -> None:
    script = round_trip_script("[r]")
    api = client(server.start(script[:3]))
    history: list[Any] = [{"role": "user", "content": "[r] What does hotel A cost?"}]
    r = api.chat.completions.create(model="flowstate", messages=history, tools=[PRICE_TOOL], user="bob")
    history += [r.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": r.choices[0].message.tool_calls[0].id, "content": '{"price": 120}'}]
    r = api.chat.completions.create(model="flowstate", messages=history, tools=[PRICE_TOOL], user="bob")
    history += [r.choices[0].message.model_dump(exclude_none=True)]
    server.stop()

    api = client(server.start(script[3:]))  # a new process on the same database
    history += [{"role": "user", "content": "[r] Remind me: what did hotel A cost?"}]
    r = api.chat.completions.create(model="flowstate", messages=history, tools=[PRICE_TOOL], user="bob")
    assert r.choices[0].message.content == "It cost 120 per night."
    assert r.model_extra["flowstate"]["request"] == 2 and r.model_extra["flowstate"]["disclosed"] == ["price_a"]
    # the resent history is recognised, and a contradicting one is refused after the restart too
    history[1]["tool_calls"][0]["function"]["arguments"] = '{"hotel": "B"}'
    with pytest.raises(openai.ConflictError, match="contradicts this session's history at message 2"):
        api.chat.completions.create(model="flowstate", messages=history + [{"role": "user", "content": "x"}],
                                    user="bob")


def test_thirty_two_concurrent_sessions_see_only_their_own_states(server: Server) -> None:
    n = 32
    script: list[dict[str, Any]] = []
    for i in range(n):
        script += lines(f"[c{i:02d}]", [
            output(tools=[{"name": "get_price", "arguments": {"hotel": f"H{i}"}}]),
            output(delta=[add(f"fact_{i:02d}", refs=[("supports", "obs_r1_s1_1")], owner=i)], content=f"done {i}"),
            output(focus=[f"fact_{i:02d}", f"fact_{(i + 1) % n:02d}"]),
            output(content=f"owner {i}"),
        ])
    url = server.start(script)

    def session(i: int) -> tuple[Any, Any]:
        api = client(url)
        marker = f"[c{i:02d}]"
        done = two_turns(api, f"s{i:02d}", marker, full_history=i % 2 == 0)
        return done[-1], api.get(f"/sessions/s{i:02d}", cast_to=object)

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(session, range(n)))
    for i, (last, stored) in enumerate(results):
        ext = last.model_extra["flowstate"]
        assert last.choices[0].message.content == f"owner {i}"
        assert ext["disclosed"] == [f"fact_{i:02d}"]  # its own state, disclosed
        assert [r["target_id"] for r in ext["rejected"]] == [f"fact_{(i + 1) % n:02d}"]  # another session's: refused
        assert [n_["id"] for n_ in stored["nodes"]] == ["obs_r1_s1_1", f"fact_{i:02d}"]
        assert stored["nodes"][0]["value"]["arguments"] == {"hotel": f"H{i}"}
