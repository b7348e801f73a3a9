"""Every engine call says whose it is and how soon it is wanted: behind a stub vLLM-like server on loopback, the
server's calls for an interactive turn, a background response and a memory method's own calls (MAGE's Compress and
Maintain), and an evaluation's, each carry the session's routing id in the router's header (a keyed id, never the
session's name), the tenant's cache salt, OpenAI's ``prompt_cache_key`` where asked, and the priority of their kind."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

import engine as engines
from engine.priority import Priorities
from flowstate import Agent, Repository
from flowstate.memory.mage import MAGE
from serving.app import create_app
from serving.services import ServerConfig
from serving.tenancy import routing_ids
from tests.engine.openai_stub import send, send_completion
from tests.engine.test_memory_routing import answer

Call = dict[str, Any]  # kind, session (as the prompt names it), the call's headers and body


@pytest.fixture
def stub() -> Iterator[tuple[str, list[Call]]]:
    """A server whose models are vLLM's (so FlowState sends it salts and priorities), answering MAGE's calls."""
    calls: list[Call] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            send(self, json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": 0,
                                                                "owned_by": "vllm"}]}).encode(), "application/json")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            kind, session, text = answer(body["messages"][0]["content"], body["messages"][-1]["content"])
            calls.append({"kind": kind, "session": session, "headers": {k.lower(): v for k, v in self.headers.items()},
                          "body": body})
            send_completion(self, text, 10, 0)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", calls
    server.shutdown()
    server.server_close()


def _serve(url: str, priorities: Priorities = Priorities(), **engine: str) -> Iterator[tuple[TestClient, Any]]:
    model = engines.load("openai", base_url=url, backoff_s=0.01, **engine)
    with Repository.open(":memory:") as repo:
        config = ServerConfig(engine=model, repo=repo, keys=("key-a", "key-b"), strategy=MAGE, priorities=priorities,
                              cache_secret=b"s" * 32)
        with TestClient(create_app(config), base_url="http://flowstate.test") as http:
            yield http, openai.OpenAI(base_url="http://flowstate.test/v1", api_key="key-a", http_client=http,
                                      max_retries=0)


def _background(api: Any, session: str, text: str) -> None:
    started = api.responses.create(model="flowstate", input=text, background=True, user=session)
    deadline = time.monotonic() + 30
    while api.responses.retrieve(started.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, "the background response never ended"
        time.sleep(0.05)
    assert api.responses.retrieve(started.id).status == "completed"


def test_each_kind_of_call_carries_its_priority_routing_id_and_salt(stub: tuple[str, list[Call]]) -> None:
    url, calls = stub
    for http, api in _serve(url):
        api.chat.completions.create(model="flowstate", user="s1", messages=[{"role": "user", "content": "s1 q 0"}])
        interactive = len(calls)
        _background(api, "s2", "s2 q 0")
    by = {(c["session"], c["kind"]): c for c in calls}
    assert {k for _, k in by} == {"step", "compress", "maintain"}
    # an interactive turn first, a memory method's call next, a background response's (its memory calls too) after
    assert [by["s1", k]["body"].get("priority", 0) for k in ("step", "compress", "maintain")] == [0, 1, 1]
    assert [by["s2", k]["body"]["priority"] for k in ("step", "compress", "maintain")] == [2, 2, 2]
    assert all(c["session"] == "s1" for c in calls[:interactive])
    route = routing_ids(b"s" * 32)
    for session in ("s1", "s2"):
        mine = [c for c in calls if c["session"] == session]
        ids = {c["headers"]["x-session-id"] for c in mine}
        salts = {c["body"]["cache_salt"] for c in mine}
        assert len(ids) == 1 and len(salts) == 1  # every call of the session, memory calls included
        (sent,) = ids
        assert len(sent) == 22 and session not in sent  # a keyed id: no router's log reads the session's name
        assert "prompt_cache_key" not in mine[0]["body"]  # a vLLM server is not sent OpenAI's key unasked
    assert {c["body"]["cache_salt"] for c in calls if c["session"] == "s1"} == \
           {c["body"]["cache_salt"] for c in calls if c["session"] == "s2"}  # one tenant, one partition
    assert calls[0]["headers"]["x-session-id"] != calls[-1]["headers"]["x-session-id"]
    assert route("key-a/s1") != route("key-b/s1")  # a tenant's session name routes apart from another's


def test_an_evaluation_runs_behind_everyone_and_priorities_can_be_off(stub: tuple[str, list[Call]]) -> None:
    url, calls = stub
    model = engines.load("openai", base_url=url, backoff_s=0.01, prompt_cache_key="on")
    with Repository.open(":memory:") as repo:
        Agent(model, repository=repo, session="s3", strategy=MAGE, lane="evaluation").run("s3 q 0")
    assert {c["body"]["priority"] for c in calls} == {3} and len(calls) == 3
    assert {c["body"]["prompt_cache_key"] for c in calls} == {c["headers"]["x-session-id"] for c in calls} == {"s3"}
    calls.clear()
    for _, api in _serve(url, priorities=Priorities.parse("off")):
        _background(api, "s4", "s4 q 0")
    assert calls and all("priority" not in c["body"] for c in calls)


def test_a_server_not_vllms_is_sent_no_priority_and_a_lane_must_be_known(stub: tuple[str, list[Call]]) -> None:
    url, calls = stub
    model = engines.load("openai", base_url=url, backoff_s=0.01, priority="off", cache_salt="off")
    assert not model.capabilities.priority and not model.capabilities.salts
    with Repository.open(":memory:") as repo:
        Agent(model, repository=repo, session="s5", strategy=MAGE, lane="background").run("s5 q 0")
        with pytest.raises(ValueError, match="lane is one of interactive, background, evaluation"):
            Agent(model, repository=repo, session="s6", lane="batch")
    assert calls and all("priority" not in c["body"] and "cache_salt" not in c["body"] for c in calls)
