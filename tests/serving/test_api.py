"""Keys and isolation, malformed requests, failures, inspection, models, health and metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import add, output
from tests.serving.conftest import Server, lines
from tests.serving.test_chat import PRICE_TOOL, client, round_trip_script


def test_two_keys_same_session_name_never_leak(server: Server) -> None:
    script = lines("[k1]", [output(delta=[add("secret_k1", code=1234)], content="noted")])
    script += lines("[k2]", [output(focus=["secret_k1"]), output(content="nothing to see")])
    url = server.start(script, "--api-key", "key-one", "--api-key", "key-two")
    one, two = client(url, "key-one"), client(url, "key-two")
    one.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[k1] remember 1234"}],
                                user="shared")
    r = two.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[k2] what is the code?"}],
                                    user="shared")

    ext = r.model_extra["flowstate"]
    assert ext["request"] == 1  # key two's "shared" is a new session
    assert ext["disclosed"] == [] and [x["target_id"] for x in ext["rejected"]] == ["secret_k1"]
    assert [s["id"] for s in two.get("/sessions", cast_to=object)["data"]] == ["shared"]
    assert [n["id"] for n in two.get("/sessions/shared", cast_to=object)["nodes"]] == []
    assert "secret_k1" not in httpx.get(url + "/sessions/shared/graph",
                                        headers={"Authorization": "Bearer key-two"}).text
    two.delete("/sessions/shared", cast_to=object)
    with pytest.raises(openai.NotFoundError):
        two.get("/sessions/shared", cast_to=object)
    assert [n["id"] for n in one.get("/sessions/shared", cast_to=object)["nodes"]] == ["secret_k1"]  # untouched

    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "key-one"}):
        for method, path in (("POST", "/chat/completions"), ("GET", "/sessions"), ("GET", "/sessions/shared"),
                             ("GET", "/sessions/shared/graph"), ("DELETE", "/sessions/shared"), ("GET", "/models")):
            resp = httpx.request(method, url + path, headers=headers, json={})
            assert resp.status_code == 401, (method, path, headers)
            assert resp.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        client(url, "wrong").chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "hi"}])


BAD: list[tuple[str, Any, int, str]] = [
    ("not json", b"{oops", 400, "not valid JSON"),
    ("not an object", b"[1, 2]", 400, "must be a JSON object"),
    ("no messages", {"model": "flowstate"}, 400, "messages"),
    ("empty messages", {"model": "flowstate", "messages": []}, 400, "messages"),
    ("unknown role", {"model": "flowstate", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("unknown model", {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
    ("n = 2", {"model": "flowstate", "n": 2, "messages": [{"role": "user", "content": "x"}]}, 400, "n > 1"),
    ("n = 0", {"model": "flowstate", "n": 0, "messages": [{"role": "user", "content": "x"}]}, 400,
     "n must be at least 1"),
    ("tool_choice required",
     {"model": "flowstate", "tool_choice": "required", "messages": [{"role": "user", "content": "x"}]}, 400,
     "tool_choice"),
    ("image part",
     {"model": "flowstate",
      "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "only text"),
    ("bad tool name",
     {"model": "flowstate", "tools": [{"type": "function", "function": {"name": "no spaces"}}],
      "messages": [{"role": "user", "content": "x"}]}, 400, "tools"),
    ("session name too long", {"model": "flowstate", "user": "x" * 201, "messages": [{"role": "user", "content": "x"}]},
     400, "invalid session name"),
    *[(f"session name {n!r}", {"model": "flowstate", "user": n, "messages": [{"role": "user", "content": "x"}]}, 400,
       "invalid session name") for n in ("a/b", "../x", "x/graph", "..")],
    # what an adversarial probe turned into 500s: each a 4xx now, with nothing stored
    ("deeply nested JSON", b'{"model": "flowstate", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
     "nested too deeply"),
    ("an integer of 5,000 digits",
     b'{"model": "flowstate", "n": 1' + b"0" * 5_000 + b', "messages": [{"role": "user", "content": "x"}]}', 400,
     "not valid JSON"),
    ("NaN", b'{"model": "flowstate", "n": NaN, "messages": [{"role": "user", "content": "x"}]}', 400,
     "NaN is not JSON"),
    ("lone surrogate in user",
     b'{"model": "flowstate", "user": "\\ud800", "messages": [{"role": "user", "content": "x"}]}', 400,
     "lone surrogate"),
    ("lone surrogate in content", b'{"model": "flowstate", "messages": [{"role": "user", "content": "a\\udfffb"}]}',
     400, "lone surrogate"),
    ("lone surrogate in a tool name",
     b'{"model": "flowstate", "tools": [{"type": "function", "function": {"name": "\\ud83d"}}], "messages": [{"role": '
     b'"user", "content": "x"}]}', 400, "lone surrogate"),
    ("huge integer in tool-call arguments", {"model": "flowstate", "user": "victim", "messages": [
        {"role": "user", "content": "[v] What does hotel A cost?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_obs_r1_s1_1", "type": "function",
             "function": {"name": "get_price", "arguments": '{"hotel": 1' + "0" * 5000 + "}"}}]},
        {"role": "user", "content": "next"}]}, 409, "contradicts"),
    ("a 10 MB message", {"model": "flowstate", "messages": [{"role": "user", "content": "x" * 10_000_000}]}, 413,
     "larger than"),
    ("200 tools",
     {"model": "flowstate", "tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(200)],
                   "messages": [{"role": "user", "content": "x"}]}, 400, "at most 128 tools"),
    ("duplicate tool names", {"model": "flowstate", "tools": [{"type": "function", "function": {"name": "t"}}] * 2,
                              "messages": [{"role": "user", "content": "x"}]}, 400, "unique"),
    ("invalid tool schema",
     {"model": "flowstate",
      "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "objekt"}}}],
                             "messages": [{"role": "user", "content": "x"}]}, 400, "not a valid JSON Schema"),
    ("tool parameters not an object",
     {"model": "flowstate",
      "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "string"}}}],
                                       "messages": [{"role": "user", "content": "x"}]}, 400, "must describe an object"),
    ("blank user message", {"model": "flowstate", "user": "fresh", "messages": [{"role": "user", "content": " "}]}, 400,
     "empty"),
    ("tool answering no pending call",
     {"model": "flowstate", "user": "victim", "messages": [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
     400, "answers no pending call"),
    ("assistant message as new input",
     {"model": "flowstate", "user": "victim", "messages": [{"role": "assistant", "content": "I said so"}]}, 400,
     "assistant messages"),
    ("history contradicting the session", {"model": "flowstate", "user": "victim", "messages": [
        {"role": "user", "content": "[v] What does hotel A cost?"}, {"role": "assistant", "content": "Something else"},
        {"role": "user", "content": "next"}]}, 409, "contradicts"),
    ("nothing new", {"model": "flowstate", "user": "victim", "messages": [
        {"role": "user", "content": "[v] What does hotel A cost?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_obs_r1_s1_1", "type": "function",
             "function": {"name": "get_price", "arguments": '{"hotel": "A"}'}}]},
        {"role": "tool", "tool_call_id": "call_obs_r1_s1_1", "content": '{"price": 120}'},
        {"role": "assistant", "content": "Hotel A costs 120 per night."}]}, 400, "no new message"),
]


def test_malformed_requests_get_openai_shaped_4xx_and_lose_nothing(server: Server) -> None:
    url = server.start(round_trip_script("[v]"))
    api = client(url)
    history: list[Any] = [{"role": "user", "content": "[v] What does hotel A cost?"}]
    r = api.chat.completions.create(model="flowstate", messages=history, tools=[PRICE_TOOL], user="victim")
    call_id = r.choices[0].message.tool_calls[0].id
    pending_user = {"model": "flowstate", "user": "victim", "messages": [{"role": "user", "content": "something else"}]}
    wrong_id = {"model": "flowstate", "user": "victim",
                "messages": [{"role": "tool", "tool_call_id": "call_nope", "content": "1"}]}
    for body, status, text in ((pending_user, 409, "pending"), (wrong_id, 400, "answers no pending call")):
        resp = httpx.post(url + "/chat/completions", json=body)
        assert resp.status_code == status and text in resp.json()["error"]["message"]
    r = api.chat.completions.create(model="flowstate", user="victim", tools=[PRICE_TOOL],
                                    messages=[{"role": "tool", "tool_call_id": call_id, "content": '{"price": 120}'}])
    assert r.choices[0].message.content == "Hotel A costs 120 per night."
    before = api.get("/sessions/victim", cast_to=object)
    stored = dump_db(server.db)

    for name, body, status, text in BAD:
        kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        resp = httpx.post(url + "/chat/completions", headers={"content-type": "application/json"}, **kwargs)
        assert resp.status_code == status, (name, resp.text)
        error = resp.json()["error"]
        assert text in error["message"] or text == error.get("param"), (name, error)
        assert set(error) == {"message", "type", "param", "code"}
    for method, path in (("GET", "/sessions/nobody"), ("GET", "/sessions/nobody/graph"),
                         ("DELETE", "/sessions/nobody")):
        resp = httpx.request(method, url + path)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "session_not_found"
    assert api.get("/sessions/victim", cast_to=object) == before
    assert [s["id"] for s in api.get("/sessions", cast_to=object)["data"]] == ["victim"]
    after = dump_db(server.db)
    audited = [line for line in after if line.startswith('INSERT INTO "audit"')]
    chained = [line for line in after if line.startswith('INSERT INTO "audit_chain"')]
    assert [line for line in after if line not in audited + chained] == stored  # the database, row for row
    assert len(audited) == 1 and "'session.delete','nobody','refused'" in audited[0]  # the attempt, as refused
    assert len(chained) == 1  # and its link in the trail's chain


def dump_db(path: Any) -> list[str]:
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_a_model_that_breaks_the_protocol_is_a_502_and_keeps_it_unfinished(server: Server) -> None:
    script = lines("[bad]",
                   ["garbage", "<state_focus>[", "still not it"] * 2) + lines("[bad]", [output(content="fine now")])
    api = client(server.start(script, "--max-protocol-errors", "3"))
    messages: Any = [{"role": "user", "content": "[bad] hello"}]
    with pytest.raises(openai.APIStatusError) as info:
        api.chat.completions.create(model="flowstate", messages=messages, user="flaky")
    assert (info.value.status_code == 502
            and "kept in the session's memory as an unfinished request" in info.value.message)
    stream = api.chat.completions.create(model="flowstate", messages=messages, user="flaky", stream=True)
    with pytest.raises(openai.APIError, match="as an unfinished request"):
        list(stream)  # a streamed turn that fails ends with an error event
    # both failures are in memory (unfinished, their own k); the chat holds neither, so the retry is a new turn
    r = api.chat.completions.create(model="flowstate", messages=messages, user="flaky")  # the retry succeeds
    assert r.choices[0].message.content == "fine now" and r.model_extra["flowstate"]["request"] == 3


def test_models_health_metrics_graph_and_fingerprint_sessions(server: Server) -> None:
    script = lines("[m]", [output(delta=[add("pref_quiet", "preference", room="quiet")], content="noted")])
    url = server.start(script)
    api = client(url)
    assert [m.id for m in api.models.list()] == ["flowstate"]
    messages: Any = [{"role": "system", "content": "policy"}, {"role": "user", "content": "[m] I like quiet rooms"}]
    r = api.chat.completions.create(model="flowstate", messages=messages)  # no session named
    session = r.model_extra["flowstate"]["session"]
    assert session.startswith("fp-") and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    page = httpx.get(f"{url}/sessions/{session}/graph")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'data-id="pref_quiet" data-type="preference"' in page.text and "<svg" in page.text
    policy = page.headers["content-security-policy"]  # nothing but the page's own inline SVG and styles may run
    assert ("default-src 'none'" in policy and "script-src" not in policy
            and page.headers["x-content-type-options"] == "nosniff")

    metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line and not line.startswith("#")}
    assert values['flowstate_turns_total{outcome="stop"}'] == 1
    assert values["flowstate_model_calls_total"] == 1
    assert values["flowstate_prompt_tokens_total"] == r.usage.prompt_tokens
    assert values["flowstate_turn_latency_seconds_count"] == 1

    api.delete(f"/sessions/{session}", cast_to=object)
    assert api.get("/sessions", cast_to=object)["data"] == []


def test_a_turn_that_ends_at_the_step_budget_answers_honestly_or_fails_as_configured(server: Server) -> None:
    script = lines("[long]", [output(delta=[add("plan_a", "judgement", step=1)]), output(delta=[add("plan_b")])])
    api = client(server.start(script + lines("[next]", [output(content="continuing")]), "--max-steps", "2"))
    r = api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[long] do it all"}],
                                    user="budget")
    content = r.choices[0].message.content or ""
    # an unfinished request says so: OpenAI's "cut by a budget", and the reason in FlowState's extension
    assert r.choices[0].finish_reason == "length" and "could not finish" in content and "plan_a, plan_b" in content
    assert r.model_extra["flowstate"]["unfinished"] == "no final response within the step budget of 2 steps"  # type: ignore[index]
    session = api.get("/sessions/budget", cast_to=object)
    assert session["requests"][0]["unfinished"] == "no final response within the step budget of 2 steps"
    metrics = httpx.get(server.url + "/metrics").text
    assert "flowstate_requests_unfinished_total 1.0" in metrics and "flowstate_truncations_total 0.0" in metrics
    assert 'flowstate_turns_total{outcome="length"} 1.0' in metrics
    server.stop()  # the honest answer is the stored history: a client resending it after a restart is recognised
    api = client(server.start(lines("[next]", [output(content="continuing")]), "--max-steps", "2"))
    history: Any = [{"role": "user", "content": "[long] do it all"}, {"role": "assistant", "content": content},
                    {"role": "user", "content": "[next] go on"}]
    assert api.chat.completions.create(model="flowstate", messages=history,
                                       user="budget").choices[0].message.content == "continuing"
    server.stop()
    api = client(server.start(script, "--max-steps", "2", "--on-budget", "fail"))
    with pytest.raises(openai.APIStatusError) as info:
        api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[long] again"}],
                                    user="strict")
    assert info.value.status_code == 502 and "step budget" in info.value.message


def test_metrics_show_a_key_its_own_turns_and_the_operator_the_whole_server(server: Server) -> None:
    script = lines("[m]", [output(content="for a"), output(content="for a again"), output(content="for b")])
    url = server.start(script, "--api-key", "key-a", "--api-key", "key-b", "--metrics-key", "ops")
    for key, n in (("key-a", 2), ("key-b", 1)):
        for i in range(n):
            client(url, key).chat.completions.create(model="flowstate", user="s",
                                                     messages=[{"role": "user", "content": f"[m] turn {i}"}])

    def turns(key: str | None) -> float:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.get(server.url + "/metrics", headers=headers)
        if r.status_code != 200:
            return -r.status_code
        found = [line for line in r.text.splitlines() if line.startswith('flowstate_turns_total{outcome="stop"}')]
        return float(found[0].split()[1]) if found else 0.0

    assert (turns("key-a"), turns("key-b"), turns("ops")) == (2.0, 1.0, 3.0)
    assert turns(None) == -401 and turns("wrong") == -401
    operator = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer ops"}).text
    assert "flowstate_model_calls_total 3.0" in operator


def test_a_server_takes_its_options_from_a_file_and_a_flag_beats_it(server: Server, tmp_path: Path) -> None:
    """``serve --config FILE``: the file's options in force on a real server, the command line's flag over the
    file's (``--port``: the harness gives its own), said once at start."""
    file = tmp_path / "serve.toml"
    file.write_text('port = 1\nmodel-id = "from-the-file"\nmax-steps = 4\n')
    url = server.start([{"text": output(content="hi")}], "--config", str(file))
    assert [m["id"] for m in httpx.get(f"{url}/models", timeout=30).json()["data"]][0] == "from-the-file"
    said = server.log.read_text()
    assert f"--port on the command line beats {file}" in said and said.count("beats") == 1
