"""A memory method's own model calls take the request's engine path: behind several OpenAI-compatible servers
(two on loopback), each session's steps and its memory calls (MAGE's Compress and Maintain) land on one
server — the one holding its cached prefix — and sessions still spread over both."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import engine as engines
from flowstate import Agent, Repository
from flowstate.memory.mage import COMPRESS, MAGE, MAINTAIN
from flowstate.protocol import ModelOutput, render_output
from tests.engine.openai_stub import send_completion

Calls = list[tuple[str, str]]  # (kind of call, session)


def answer(system: str, user: str) -> tuple[str, str, str]:
    """(kind, session, reply) for one call: a step of the agent, or one of MAGE's memory calls."""
    if COMPRESS in system:
        session = re.search(r'"user_query":"(s\d+) ', user).group(1)  # type: ignore[union-attr]
        return "compress", session, json.dumps({"summary": f"{session} asked"})
    if MAINTAIN in system:
        session = re.search(r'"user_query":"(s\d+) ', user).group(1)  # type: ignore[union-attr]
        return "maintain", session, json.dumps({"valid": True, "note": ""})
    query = re.search(r"<user_query>\n(.*?)\n</user_query>", user, re.S).group(1)  # type: ignore[union-attr]
    out = ModelOutput.model_validate({"assistant_message": {"content": f"{query} answered"}})
    return "step", query.split()[0], render_output(out, MAGE.blocks)


def fake_server() -> tuple[ThreadingHTTPServer, Calls]:
    seen: Calls = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            kind, session, text = answer(body["messages"][0]["content"], body["messages"][-1]["content"])
            seen.append((kind, session))
            send_completion(self, text, 10, 5)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def servers() -> Iterator[list[tuple[ThreadingHTTPServer, Calls]]]:
    pair = [fake_server(), fake_server()]
    yield pair
    for s, _ in pair:
        s.shutdown()
        s.server_close()


SESSIONS = 20  # rendezvous hashing over random ports: all on one server has probability 2 / 2**20


def test_memory_calls_go_where_the_sessions_steps_go(servers: list[tuple[ThreadingHTTPServer, Calls]]) -> None:
    urls = ",".join(f"http://127.0.0.1:{s.server_address[1]}/v1" for s, _ in servers)
    router = engines.load("openai", base_url=urls, model="m", backoff_s=0.01)
    with Repository.open(":memory:") as repo:
        for i in range(SESSIONS):
            agent = Agent(router, repository=repo, session=f"s{i}", strategy=MAGE)
            for round_ in range(2):
                record = agent.run(f"s{i} question {round_}")
                assert record.response == f"s{i} question {round_} answered"
                assert len(record.memory_calls) == 2  # Compress and Maintain, counted for the method
    where: dict[str, set[int]] = {}
    for n, (_, seen) in enumerate(servers):
        for kind, session in seen:
            where.setdefault(session, set()).add(n)
    kinds = {kind for _, seen in servers for kind, _ in seen}
    assert kinds == {"step", "compress", "maintain"}
    assert all(len(on) == 1 for on in where.values()), where  # every call of a session on one server
    assert {n for on in where.values() for n in on} == {0, 1}  # and the sessions spread over both
