"""The session contract under concurrency, named or not: each conversation its own session; an Idempotency-Key
runs its turn exactly once whatever arrives while it runs; a trimmed history is recognised, an edited one refused
(409), never grafted. A server-side tool that waits (``slow_tools``) keeps each first turn running while the
concurrent calls arrive."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import output
from tests.serving.conftest import Server, lines

pytestmark = pytest.mark.slow
SLOW = ("--tools", "tests.serving.slow_tools:TOOLS")
WAIT = output(tools=[{"name": "wait", "arguments": {"seconds": 1.0}}])
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)


def session_of(reply: Any) -> str:
    return str(reply.model_extra["flowstate"]["session"])


def requests_of(url: str, session: str) -> list[str]:
    return [r["query"] for r in httpx.get(f"{url}/sessions/{session}", timeout=10).json()["requests"]]


def stored(url: str) -> int:
    """Requests stored over every session of the server."""
    return sum(int(d["requests"]) for d in httpx.get(f"{url}/sessions", timeout=10).json()["data"])


def test_same_opening_conversations_sent_at_once_get_a_session_each(server: Server) -> None:
    # (the replies differ: two conversations identical to their last word could be told apart by nothing)
    script = [*lines("[hi] Hello", [WAIT, WAIT, output(content="Hi there."), output(content="Hello there.")]),
              *lines("[a2]", [output(content="about a")]), *lines("[b2]", [output(content="about b")])]
    url = server.start(script, *SLOW)
    client = api(url)
    opening = [SYSTEM, {"role": "user", "content": "[hi] Hello"}]
    with ThreadPoolExecutor(2) as pool:
        firsts = list(pool.map(lambda _: client.chat.completions.create(model="flowstate", messages=opening), "ab"))
    sessions = [session_of(r) for r in firsts]
    assert sessions[0] != sessions[1]  # sent at once, still two conversations
    for first, tag, session in zip(firsts, ("a2", "b2"), sessions, strict=True):
        history = [*opening, {"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": f"[{tag}] and then?"}]
        second = client.chat.completions.create(model="flowstate", messages=history)
        assert session_of(second) == session  # its next turn stays with its first
        assert requests_of(url, session) == ["[hi] Hello", f"[{tag}] and then?"]


def test_an_idempotency_key_runs_its_turn_once_whatever_arrives_while_it_runs(server: Server) -> None:
    script = lines("[k]", [WAIT, output(content="done once"), WAIT, output(content="ran twice")])
    url = server.start(script, *SLOW)
    client = api(url)
    messages = [{"role": "user", "content": "[k] book it"}]
    headers = {"Idempotency-Key": "book-1"}

    def call(delay: float) -> Any:
        time.sleep(delay)  # the second arrives while the first's turn runs (it waits a second in a tool)
        return client.chat.completions.create(model="flowstate", messages=messages, extra_headers=headers)

    with ThreadPoolExecutor(2) as pool:  # two calls with one key, no session named
        replies = list(pool.map(call, (0.0, 0.4)))
    assert [r.choices[0].message.content for r in replies] == ["done once", "done once"]
    assert session_of(replies[0]) == session_of(replies[1])
    assert requests_of(url, session_of(replies[0])) == ["[k] book it"] and stored(url) == 1
    assert sorted(bool(r.model_extra["flowstate"].get("replayed")) for r in replies) == [False, True]


def test_a_cancelled_stream_retried_at_once_with_its_key_gets_the_first_turns_reply(server: Server) -> None:
    script = lines("[c]", [WAIT, output(content="streamed once"), WAIT, output(content="ran twice")])
    url = server.start(script, *SLOW)
    body = {"model": "flowstate", "messages": [{"role": "user", "content": "[c] go"}], "stream": True}
    headers = {"Idempotency-Key": "go-1"}
    gone = threading.Event()

    def cancel() -> None:
        with httpx.stream("POST", f"{url}/chat/completions", json=body, headers=headers, timeout=60) as r:
            assert r.status_code == 200
            gone.set()  # the client goes away while the turn runs
    cancel()
    assert gone.is_set()
    time.sleep(0.1)
    retry = api(url).chat.completions.create(model="flowstate", messages=body["messages"], extra_headers=headers)
    assert retry.model_extra["flowstate"].get("replayed")  # the first turn's reply, not a second turn
    assert requests_of(url, session_of(retry)) == ["[c] go"] and stored(url) == 1


def test_a_trimmed_history_continues_and_an_edited_one_is_refused(server: Server) -> None:
    script = lines("[t]", [output(content="one"), output(content="two"), output(content="three"),
                           output(content="never")])
    client = api(server.start(script))
    u1, u2, u3 = ({"role": "user", "content": f"[t] q{i}"} for i in (1, 2, 3))
    a1 = client.chat.completions.create(model="flowstate", messages=[u1], user="ann").choices[0].message.content
    history: list[Any] = [u1, {"role": "assistant", "content": a1}, u2]
    a2 = client.chat.completions.create(model="flowstate", messages=history, user="ann").choices[0].message.content
    history += [{"role": "assistant", "content": a2}]
    trimmed = [*history[2:], u3]  # the oldest turn dropped, as a context-window manager does
    r3 = client.chat.completions.create(model="flowstate", messages=trimmed, user="ann")
    assert r3.choices[0].message.content == "three"
    url = str(client.base_url).rstrip("/")
    assert requests_of(url, "ann") == ["[t] q1", "[t] q2", "[t] q3"]  # only q3 is new, nothing relabelled
    resend = history[1:3]  # turn 2 resent (its reply lost) with the oldest message dropped
    again = client.chat.completions.create(model="flowstate", messages=resend, user="ann")
    assert again.choices[0].message.content == "two" and again.model_extra["flowstate"]["replayed"]
    edited = [{"role": "assistant", "content": "two, I said, and more"}, u3,
              {"role": "assistant", "content": "three"}, {"role": "user", "content": "[t] q4"}]
    with pytest.raises(openai.ConflictError) as refused:
        client.chat.completions.create(model="flowstate", messages=edited, user="ann")
    assert refused.value.body["code"] == "history_mismatch"  # type: ignore[index]
    assert requests_of(url, "ann") == ["[t] q1", "[t] q2", "[t] q3"]
