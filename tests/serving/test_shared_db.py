"""Several `flowstate serve` processes on one PostgreSQL database: a session continues on any of them,
and two turns of one session that arrive at two servers at once run one after the other."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowstate import Repository
from tests.helpers import add, output
from tests.serving.conftest import Server, lines
from tests.serving.test_chat import client


def pause(seconds: float) -> str:
    """Wait, then say so (a slow server-side tool, so that two turns overlap)."""
    time.sleep(seconds)
    return "waited"


TOOLS = [pause]


@pytest.fixture
def shared_db(pg_server: Any) -> Iterator[str]:
    url = pg_server.new_database()
    yield url
    pg_server.drop(url)


def start(tmp: Path, db: str, script: list[dict[str, Any]]) -> tuple[Server, str]:
    tmp.mkdir()
    server = Server(tmp)
    server.db = db  # type: ignore[assignment]
    return server, server.start(script, "--tools", "tests.serving.test_shared_db:TOOLS")


@pytest.mark.slow
def test_a_session_continues_on_whichever_server_gets_the_turn(tmp_path: Path, shared_db: str) -> None:
    a, url_a = start(tmp_path / "a", shared_db, lines("[alt]", [
        output(delta=[add("note_one", number=1)], content="one"), output(content="three")]))
    b, url_b = start(tmp_path / "b", shared_db, lines("[alt]", [output(focus=["note_one"]), output(content="two")]))
    try:
        history: list[dict[str, Any]] = []
        for url, text in ((url_a, "[alt] first"), (url_b, "[alt] second"), (url_a, "[alt] third")):
            history.append({"role": "user", "content": text})
            reply = client(url).chat.completions.create(model="flowstate", messages=history, user="alice")
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
        assert [m["content"] for m in history[1::2]] == ["one", "two", "three"]
        for url in (url_a, url_b):
            assert [r["query"] for r in client(url).get("/sessions/alice", cast_to=object)["requests"]] == \
                ["[alt] first", "[alt] second", "[alt] third"]
    finally:
        a.stop()
        b.stop()
    with Repository.open(shared_db) as repo:
        # server B disclosed the state that server A's turn kept
        assert repo.records.request("alice", 2)["steps"][0]["disclosed"] == ["note_one"]


@pytest.mark.slow
def test_two_turns_of_one_session_at_two_servers_run_one_after_the_other(tmp_path: Path, shared_db: str) -> None:
    slow = [output(tools=[{"name": "pause", "arguments": {"seconds": 1.5}}]), output(content="done")]
    a, url_a = start(tmp_path / "a", shared_db, lines("[c]", slow))
    b, url_b = start(tmp_path / "b", shared_db, lines("[c]", slow))
    try:
        def turn(url: str, text: str) -> tuple[int, float, float]:
            t0 = time.monotonic()
            r = httpx.post(url + "/chat/completions", timeout=60, headers={"Idempotency-Key": text},
                           json={"model": "flowstate", "user": "carol",
                                 "messages": [{"role": "user", "content": text}]})
            return r.status_code, t0, time.monotonic()

        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(lambda args: turn(*args), [(url_a, "[c] one"), (url_b, "[c] two")])
        assert first[0] == second[0] == 200
        spans = sorted([first[1:], second[1:]], key=lambda s: s[1])
        assert spans[1][1] - spans[0][1] >= 1.4  # the later turn waited for the earlier one, then ran its own pause
    finally:
        a.stop()
        b.stop()
    with Repository.open(shared_db) as repo:
        requests = repo.requests("carol")
        assert [r.index for r in requests] == [1, 2] and sorted(r.query for r in requests) == ["[c] one", "[c] two"]
        assert all(r.response == "done" for r in requests)


def tool_call(url: str, session: str) -> Any:
    from tests.serving.test_chat import PRICE_TOOL

    r = client(url).chat.completions.create(model="flowstate", tools=[PRICE_TOOL], user=session,
                                            messages=[{"role": "user", "content": "[w] What does hotel A cost?"}])
    assert r.choices[0].finish_reason == "tool_calls"
    return r.choices[0].message.tool_calls[0]


def answer(url: str, session: str, call: Any) -> Any:
    return client(url).chat.completions.create(model="flowstate", user=session, messages=[
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"price": 120})}])


WAIT = [output(tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]),
        output(delta=[add("price_a", refs=[("supports", "obs_r1_s1_1")], price=120)], content="Hotel A costs 120.")]


@pytest.mark.slow
def test_a_request_waiting_on_tool_results_outlives_a_restart(server: Server) -> None:
    url = server.start(lines("[w]", WAIT[:1]))
    call = tool_call(url, "dora")
    server.stop()
    url = server.start(lines("[w]", WAIT[1:]))  # a new process: only the database knows the request waits
    assert client(url).get("/sessions/dora", cast_to=object)["pending"] == {"tool_call_ids": [call.id]}
    reply = answer(url, "dora", call)
    assert reply.choices[0].message.content == "Hotel A costs 120."
    session = client(url).get("/sessions/dora", cast_to=object)
    assert session["pending"] is None and [r["response"] for r in session["requests"]] == ["Hotel A costs 120."]
    with Repository.open(server.db) as repo:
        assert repo.node("dora", "obs_r1_s1_1").value["result"] == {"price": 120}  # type: ignore[union-attr]
        assert repo.waiting.get("dora") is None


@pytest.mark.slow
def test_tool_results_may_reach_another_server_than_the_call(tmp_path: Path, shared_db: str) -> None:
    a, url_a = start(tmp_path / "a", shared_db, lines("[w]", WAIT[:1]) + lines("[x]", [output(content="Welcome.")]))
    b, url_b = start(tmp_path / "b", shared_db, lines("[w]", WAIT[1:]))
    try:
        call = tool_call(url_a, "erin")
        reply = answer(url_b, "erin", call)
        assert reply.choices[0].message.content == "Hotel A costs 120."
        # server A learns from the database that the request ended: a new question is a new request there
        follow = client(url_a).chat.completions.create(model="flowstate", user="erin", messages=[
            {"role": "user", "content": "[x] thanks"}])
        assert follow.choices[0].message.content == "Welcome." and follow.model_extra["flowstate"]["request"] == 2
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
def test_one_chain_of_responses_across_two_servers(tmp_path: Path, shared_db: str) -> None:
    """The Responses API's state is the database's: a response stored by one server is continued, retrieved and
    deleted at another."""
    from tests.serving.test_responses import PRICE_TOOL, answer_call

    a, url_a = start(tmp_path / "a", shared_db, lines("[chain]", [output(tools=[{"name": "get_price",
                                                                                 "arguments": {"hotel": "A"}}])]))
    b, url_b = start(tmp_path / "b", shared_db, lines("[chain]", [output(content="Hotel A costs 120.")]))
    try:
        first = client(url_a).responses.create(model="flowstate", input="[chain] What does A cost?", tools=[PRICE_TOOL])
        answer = client(url_b).responses.create(model="flowstate", previous_response_id=first.id,
                                                input=answer_call(first), tools=[PRICE_TOOL])
        assert answer.output_text == "Hotel A costs 120."
        assert client(url_a).responses.retrieve(answer.id).previous_response_id == first.id
        client(url_a).responses.delete(answer.id)
        with pytest.raises(Exception, match="404"):
            client(url_b).responses.retrieve(answer.id)
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
@pytest.mark.parametrize("earlier", [False, True], ids=["first turn", "later turn"])
def test_a_retry_of_an_unnamed_conversation_at_another_server_is_recognised_while_the_first_runs(
        tmp_path: Path, shared_db: str, earlier: bool) -> None:
    """No user, no session header: the conversation is found by its history. The retry (same Idempotency-Key)
    reaches server b while server a still runs the call; b gets a's reply, and nothing runs or is stored twice."""
    opening = [output(content="hello")] if earlier else []
    slow = [output(tools=[{"name": "pause", "arguments": {"seconds": 2.0}}]), output(content="booked")]
    a, url_a = start(tmp_path / "a", shared_db, lines("[u]", [*opening, *slow]))
    b, url_b = start(tmp_path / "b", shared_db, lines("[u]", [slow[0], output(content="ran twice")]))  # never, if right
    history: list[dict[str, Any]] = [{"role": "system", "content": "You book rooms."}]
    try:
        if earlier:
            history.append({"role": "user", "content": "[u] hi"})
            r = httpx.post(url_a + "/chat/completions", timeout=60, json={"model": "flowstate", "messages": history})
            history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        history.append({"role": "user", "content": "[u] book room 7"})
        body = {"model": "flowstate", "messages": history}

        def call(url: str, delay: float) -> dict[str, Any]:
            time.sleep(delay)
            r = httpx.post(url + "/chat/completions", timeout=60, headers={"Idempotency-Key": "k-7"}, json=body)
            assert r.status_code == 200, r.text
            return dict(r.json())

        with ThreadPoolExecutor(2) as pool:
            first, retry = pool.map(lambda args: call(*args), [(url_a, 0.0), (url_b, 0.7)])
        assert first["choices"][0]["message"]["content"] == retry["choices"][0]["message"]["content"] == "booked"
        assert first["id"] == retry["id"] or first["choices"] == retry["choices"]
    finally:
        a.stop()
        b.stop()
    with Repository.open(shared_db) as repo:
        sessions = repo.sessions("")
        assert len(sessions) == 1, sessions  # the retry found the conversation's session, not a new one
        requests = repo.requests(sessions[0])
        assert [r.query for r in requests] == [*(["[u] hi"] if earlier else []), "[u] book room 7"]
