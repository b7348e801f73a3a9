"""Several OpenAI-compatible servers behind one engine, two test servers on loopback: a session's calls stay
on one server, sessions spread over both, a server killed mid-run hands its sessions to the other with no
request lost or run twice, per-server figures reach /metrics, and a server reporting no cached tokens is
warned about."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import engine as engines
from engine.router import RouterEngine
from flowstate import Agent, Repository
from tests.engine.openai_stub import send, send_completion
from tests.helpers import add, output


def fake_server(name: str, cached: int) -> tuple[ThreadingHTTPServer, list[str]]:
    """An OpenAI-compatible server that first records a note state, then answers; it logs each call's query."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            send(self, json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": 0,
                                                                "owned_by": "x"}]}).encode(), "application/json")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            user = body["messages"][-1]["content"]
            query = re.search(r"<user_query>\n(.*?)\n</user_query>", user, re.S).group(1)  # type: ignore[union-attr]
            seen.append(query)
            active = user.split("<active_state>")[1].split("</active_state>")[0]
            note = "note_" + hashlib.sha256(query.encode()).hexdigest()[:8]
            text = output(content=f"{query} answered by {name}") if note in active else output(delta=[add(note)])
            send_completion(self, text, 100, cached)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def two() -> Iterator[tuple[RouterEngine, list[tuple[ThreadingHTTPServer, list[str]]]]]:
    servers = [fake_server("A", 90), fake_server("B", 90)]
    urls = ",".join(f"http://127.0.0.1:{s.server_address[1]}/v1" for s, _ in servers)
    router = engines.load("openai", base_url=urls, model="m", backoff_s=0.01)
    assert isinstance(router, RouterEngine)
    yield router, servers
    for s, _ in servers:
        s.shutdown()
        s.server_close()


def sessions_by_server(servers: list[tuple[ThreadingHTTPServer, list[str]]]) -> list[set[str]]:
    return [{q.split()[0] for q in seen} for _, seen in servers]


# rendezvous hashing over random ports: all sessions on one server has probability 2 / 2**SESSIONS
SESSIONS = 20


def test_sessions_stay_on_one_server_spread_over_both_and_fail_over(two: Any) -> None:
    router, servers = two
    with Repository.open(":memory:") as repo:
        agents = [Agent(router, repository=repo, session=f"s{i}") for i in range(SESSIONS)]
        for round_ in range(2):
            for i, agent in enumerate(agents):
                assert agent.run(f"s{i} question {round_}").response == f"s{i} question {round_} answered by " + \
                    ("A" if f"s{i}" in sessions_by_server(servers)[0] else "B")
        on_a, on_b = sessions_by_server(servers)
        assert on_a and on_b and not on_a & on_b  # spread over both, each session's calls on one server
        servers[0][0].shutdown()  # server A dies mid-run
        servers[0][0].server_close()
        before_b = len(servers[1][1])
        for i, agent in enumerate(agents):
            assert agent.run(f"s{i} question 2").response == f"s{i} question 2 answered by B"
        assert {q.split()[0] for q in servers[1][1][before_b:]} == {f"s{i}" for i in range(SESSIONS)}
        for i in range(SESSIONS):  # nothing lost, nothing run twice
            assert [r.query for r in repo.requests(f"s{i}")] == [f"s{i} question {k}" for k in range(3)]
    stats = router.server_stats()
    a_url, b_url = (f"http://127.0.0.1:{s.server_address[1]}/v1" for s, _ in servers)
    assert stats[a_url]["errors"] >= 1 and stats[a_url]["down"] == 1.0 and stats[b_url]["errors"] == 0
    assert stats[b_url]["cached_share"] == 0.9

    from serving.metrics import Metrics

    text = Metrics(router).render().decode()
    assert f'flowstate_server_calls{{server="{b_url}"}}' in text and "flowstate_server_down" in text


def test_a_server_that_reports_no_cached_tokens_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    server, _ = fake_server("C", 0)
    try:
        engine = engines.load("openai", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m")
        with caplog.at_level(logging.WARNING, logger="flowstate.loop"), Repository.open(":memory:") as repo:
            Agent(engine, repository=repo, session="c").run("c question")
        assert "0 cached prompt tokens" in caplog.text
    finally:
        server.shutdown()
        server.server_close()


def dying_server() -> tuple[ThreadingHTTPServer, list[str]]:
    """A server that dies during its first call: the response starts streaming, then the connection drops."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append("call")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", "100000")  # promises far more than it sends
            self.end_headers()
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "<state_fo"}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # the server dies mid-call
            self.connection.close()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_a_server_that_dies_during_a_call_hands_the_step_to_another_once() -> None:
    dying, died = dying_server()
    alive, seen = fake_server("B", 90)
    try:
        servers = [dying, alive]
        urls = ",".join(f"http://127.0.0.1:{s.server_address[1]}/v1" for s in servers)
        router = engines.load("openai", base_url=urls, model="m", backoff_s=0.01, retries=0)
        with Repository.open(":memory:") as repo:
            for i in range(SESSIONS):  # rendezvous hashing puts about half the sessions on the dying server
                record = Agent(router, repository=repo, session=f"d{i}").run(f"d{i} question")
                assert record.response == f"d{i} question answered by B"
            assert died, "no session was placed on the dying server"
            for i in range(SESSIONS):  # each step redone on B, each request stored once
                assert [r.query for r in repo.requests(f"d{i}")] == [f"d{i} question"]
        stats = router.server_stats()
        assert stats[urls.split(",")[0]]["errors"] >= 1 and stats[urls.split(",")[0]]["down"] == 1.0
    finally:
        for s in (dying, alive):
            s.shutdown()
            s.server_close()
