"""Background responses through the official openai SDK against a real server, on SQLite and PostgreSQL: create
returns at once and polling sees it end; cancel stops it at a step boundary keeping what it did; a streamed one is
resumed after its client dropped it; and a server killed mid-turn leaves the response failed after a restart,
its turn never run twice."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from tests.helpers import add, output
from tests.serving.conftest import BOTH_DATABASES, Server
from tests.serving.test_chat import client

SLOW = ("--tools", "tests.serving.slow_tools:TOOLS")


def slow(seconds: float, answer: str, tag: str) -> list[dict[str, Any]]:
    return [{"text": output(tools=[{"name": "wait", "arguments": {"seconds": seconds}}]), "when": tag},
            {"text": output(delta=[add("kn_waited", waited=True)], content=answer), "when": tag}]


def poll(c: Any, rid: str, until: tuple[str, ...] = ("completed", "failed", "cancelled", "incomplete"),
         timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        r = c.responses.retrieve(rid)
        if r.status in until or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


@BOTH_DATABASES
def test_create_poll_and_cancel(server: Server) -> None:
    url = server.start(slow(3, "waited once", "[bg]") + slow(3, "never said", "[cancel]")
                       + slow(3, "later", "[again]") + [{"text": output(content="plain"), "when": "[fg]"}], *SLOW)
    c = client(url, "none")
    started = time.monotonic()
    r = c.responses.create(model="flowstate", input="[bg] wait a bit", background=True, user="ann")
    assert time.monotonic() - started < 2.5  # it returned before its 3 s tool call ended
    assert r.status == "in_progress" and r.background is True and r.output == []
    assert c.responses.retrieve(r.id).status == "in_progress"
    done = poll(c, r.id)
    assert done.status == "completed" and done.output_text == "waited once" and done.background is True
    with pytest.raises(Exception, match="not a background response"):
        c.responses.cancel(c.responses.create(model="flowstate", input="[fg] hi", user="bob").id)
    assert c.responses.cancel(r.id).status == "completed"  # cancelling an ended one gives it as it ended

    # cancel: the turn stops after its current step (the 3 s tool call), keeping that step
    r2 = c.responses.create(model="flowstate", input="[cancel] wait longer", background=True, user="cat")
    time.sleep(0.5)
    cancelled = c.responses.cancel(r2.id)
    assert cancelled.status == "cancelled" and c.responses.retrieve(r2.id).status == "cancelled"
    session = httpx.get(f"{url}/sessions/cat", timeout=30).json()
    assert len(session["requests"]) == 1 and "cancelled" in (session["requests"][0]["unfinished"] or "")
    assert session["requests"][0]["response"] is None
    r3 = c.responses.create(model="flowstate", input="[again] wait", background=True, user="dan")
    with pytest.raises(Exception, match="still in_progress"):  # a running one cannot be continued from
        c.responses.create(model="flowstate", input="[fg] on", previous_response_id=r3.id)
    with pytest.raises(Exception, match="cancelled: it has no reply"):
        c.responses.create(model="flowstate", input="[fg] on", previous_response_id=r2.id)
    with pytest.raises(Exception, match="store"):
        c.responses.create(model="flowstate", input="[fg] x", background=True, store=False)


@BOTH_DATABASES
def test_a_dropped_stream_resumes(server: Server) -> None:
    url = server.start(slow(1, "streamed after a wait", "[st]"), *SLOW)
    c = client(url, "none")
    stream = c.responses.create(model="flowstate", input="[st] stream it", background=True, stream=True, user="eve")
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 2:
            break
    stream.close()  # the client goes away; the turn does not
    rid = first[0].response.id
    assert [e.type for e in first] == ["response.created", "response.in_progress"]
    rest = list(c.responses.retrieve(rid, stream=True, starting_after=first[-1].sequence_number))
    assert [e.sequence_number for e in rest] == list(range(2, 2 + len(rest)))
    assert rest[-1].type == "response.completed" and rest[-1].response.output_text == "streamed after a wait"
    again = list(c.responses.retrieve(rid, stream=True, starting_after=-1))  # from the start, once it has ended
    assert [e.type for e in again][:2] == ["response.created", "response.in_progress"] and len(again) == len(rest) + 2
    assert httpx.get(f"{url}/responses/{rid}", params={"stream": "true", "starting_after": -5},
                     timeout=30).status_code == 400


@BOTH_DATABASES
@pytest.mark.slow
def test_a_killed_server_s_background_response_fails_and_never_reruns(server: Server) -> None:
    url = server.start(slow(8, "never", "[kill]"), *SLOW, "--background-lease", "2")
    c = client(url, "none")
    r = c.responses.create(model="flowstate", input="[kill] long work", background=True, user="fay")
    time.sleep(1.0)
    assert c.responses.retrieve(r.id).status == "in_progress"
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    url = server.start(slow(8, "never", "[kill]"), *SLOW, "--background-lease", "2")
    c = client(url, "none")
    failed = poll(c, r.id, timeout=30)
    assert failed.status == "failed" and failed.error is not None and "stopped" in failed.error.message
    time.sleep(3)  # no server picks the turn up again
    assert httpx.get(f"{url}/sessions/fay", timeout=30).status_code == 404
    assert c.responses.retrieve(r.id).status == "failed"


@BOTH_DATABASES
def test_a_delete_racing_a_turn_removes_what_the_turn_stored(server: Server) -> None:
    """The rule: a DELETE of a session (or conversation) while a turn runs in it waits for the turn, then removes
    everything — the turn's request, its memory and its response. The turn's client gets its answer; nothing of it
    is retrievable afterwards."""
    import threading

    url = server.start(slow(1.5, "booked", "[race]"), *SLOW)
    c = client(url, "none")
    got: dict[str, Any] = {}
    turn = threading.Thread(target=lambda: got.update(r=c.responses.create(
        model="flowstate", input="[race] book it", conversation="trip")))
    turn.start()
    deadline = time.monotonic() + 30  # the turn is running (on a loaded machine it may take a while to begin)
    while (r := httpx.get(f"{url}/sessions/trip", timeout=30)).status_code != 200 or r.json()["running"] is None:
        assert time.monotonic() < deadline, "the turn never began"
        time.sleep(0.05)
    deleted = httpx.delete(f"{url}/conversations/trip", timeout=30)
    turn.join(30)
    assert deleted.status_code == 200 and got["r"].output_text == "booked"
    assert httpx.get(f"{url}/responses/{got['r'].id}", timeout=30).status_code == 404
    assert httpx.get(f"{url}/conversations/trip", timeout=30).status_code == 404
    assert httpx.get(f"{url}/sessions", timeout=30).json()["data"] == []
