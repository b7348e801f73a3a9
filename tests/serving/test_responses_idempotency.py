"""An Idempotency-Key names one response of its API key: a retry — sequential or concurrent, unnamed, in a
conversation, continuing a response — gets the same response (same id), stored once, its turn run once; the key
reused with another body is a 422, whatever session the body would land in. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowstate import Repository
from tests.helpers import output
from tests.serving.conftest import BOTH_DATABASES, Server

SLOW = ("--tools", "tests.serving.slow_tools:TOOLS")


def post(url: str, key: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/responses", json={"model": "flowstate", **body}, headers={"Idempotency-Key": key},
                      timeout=60)


def stored(server: Server) -> list[tuple[str, str]]:
    with Repository.open(server.db) as repo, repo._read() as conn:
        return [(r[0], r[1]) for r in conn.execute("SELECT id, session FROM responses ORDER BY id")]


@BOTH_DATABASES
def test_a_key_names_one_response(server: Server) -> None:
    script = [{"text": output(tools=[{"name": "wait", "arguments": {"seconds": 1}}]), "when": "[slow]"},
              {"text": output(content="slow answer"), "when": "[slow]"}]
    script += [{"text": output(content=f"answer {i}"), "when": "[q]"} for i in range(6)]
    url = server.start(script, *SLOW)
    # concurrent: two calls with one key and one unnamed body, at once
    got: list[httpx.Response] = []
    calls = [threading.Thread(target=lambda: got.append(post(url, "k-1", input="[slow] hi"))) for _ in range(2)]
    for c in calls:
        c.start()
    for c in calls:
        c.join(60)
    assert [r.status_code for r in got] == [200, 200], [r.text for r in got]
    assert got[0].json()["id"] == got[1].json()["id"] and got[0].json()["output"] == got[1].json()["output"]
    later = post(url, "k-1", input="[slow] hi")  # and a later retry
    assert later.json()["id"] == got[0].json()["id"]
    # the key with another body: refused, wherever that body would go
    reused = post(url, "k-1", input="[q] something else")
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"
    # in a conversation, and continuing a response (an append)
    first = post(url, "k-2", input="[q] one", conversation="c1")
    assert post(url, "k-2", input="[q] one", conversation="c1").json()["id"] == first.json()["id"]
    nxt = post(url, "k-3", input="[q] two", previous_response_id=first.json()["id"])
    assert post(url, "k-3", input="[q] two", previous_response_id=first.json()["id"]).json()["id"] == nxt.json()["id"]
    assert post(url, "k-3", input="[q] three", previous_response_id=first.json()["id"]).status_code == 422
    server.stop()
    ids = [rid for rid, _ in stored(server)]
    assert sorted(ids) == sorted({got[0].json()["id"], first.json()["id"], nxt.json()["id"]})  # each stored once


@pytest.mark.slow
def test_one_response_per_key_across_two_servers(tmp_path: Path, pg_server: Any) -> None:
    """Two servers on one PostgreSQL database, a key's call sent to both at once: one turn, one stored response, the
    same id and output from both."""
    db = pg_server.new_database()
    script = [{"text": output(tools=[{"name": "wait", "arguments": {"seconds": 1}}]), "when": "[two]"},
              {"text": output(content="one answer"), "when": "[two]"}]
    a, b = Server(tmp_path / "a"), Server(tmp_path / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a.db = b.db = db  # type: ignore[assignment]
    try:
        urls = [a.start(script, *SLOW), b.start(script, *SLOW)]
        got: list[httpx.Response] = []
        calls = [threading.Thread(target=lambda u=u: got.append(post(u, "k-9", input="[two] hi", user="shared")))
                 for u in urls]
        for c in calls:
            c.start()
        for c in calls:
            c.join(60)
        assert [r.status_code for r in got] == [200, 200], [r.text for r in got]
        assert got[0].json()["id"] == got[1].json()["id"]
        assert got[0].json()["output"] == got[1].json()["output"]
        session = httpx.get(f"{urls[0]}/sessions/shared", timeout=30).json()
        assert len(session["requests"]) == 1  # the turn ran once
    finally:
        a.stop()
        b.stop()
    assert [rid for rid, _ in stored(a)] == [got[0].json()["id"]]
