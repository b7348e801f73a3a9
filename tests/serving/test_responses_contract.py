"""Errors before a response starts store nothing — in the database and in the server's memory: a fork whose first
request is refused leaves no session behind (nor blocks deleting its parent), and a refused create that named a new
conversation leaves no conversation that answers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.scripted import ScriptedEngine
from flowstate import Repository
from serving.app import create_app
from serving.services import ServerConfig
from tests.helpers import output


@pytest.fixture(params=["sqlite", "postgres"])
def http(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[TestClient]:
    sqlite = request.param == "sqlite"
    target = str(tmp_path / "m.db") if sqlite else request.getfixturevalue("pg_server").new_database()
    engine = ScriptedEngine([output(content=f"answer {i}") for i in range(50)])
    with Repository.open(target) as repo:
        with TestClient(create_app(ServerConfig(engine=engine, repo=repo)), base_url="http://t") as client:
            yield client


def create(http: TestClient, **body: Any) -> Any:
    return http.post("/v1/responses", json={"model": "flowstate", **body})


def test_a_refused_fork_leaves_no_session(http: TestClient) -> None:
    first = create(http, input="one", user="u").json()
    create(http, input="two", previous_response_id=first["id"])  # the session went on: continuing first forks
    orphan = [{"type": "function_call_output", "call_id": "call_nobody", "output": "x"}]
    refused = create(http, input=orphan, previous_response_id=first["id"])
    assert refused.status_code == 400, refused.text
    names = [s["id"] for s in http.get("/v1/sessions").json()["data"]]
    assert names == ["u"], names  # no fork_… row
    assert http.delete("/v1/sessions/u").status_code == 200  # nothing blocks deleting the parent


@pytest.mark.parametrize("bad", [
    [{"type": "function_call_output", "call_id": "call_nobody", "output": "x"}],  # refused as the call begins
    [{"role": "user", "content": "   "}],  # refused inside the turn (an empty user message)
])
def test_a_refused_create_leaves_no_conversation(http: TestClient, bad: list[dict[str, Any]]) -> None:
    r = create(http, input=bad, conversation="brand-new")
    assert r.status_code == 400, r.text
    assert http.get("/v1/conversations/brand-new").status_code == 404
    assert http.get("/v1/sessions/brand-new").status_code == 404
    assert [s["id"] for s in http.get("/v1/sessions").json()["data"]] == []
    ok = create(http, input="hello", conversation="brand-new")  # the name is still free to use
    assert ok.status_code == 200 and http.get("/v1/conversations/brand-new").status_code == 200


def test_a_refusal_names_its_real_cause(http: TestClient) -> None:
    """Continuing from a response whose session is gone says so (not that it ended inside a request)."""
    first = create(http, input="one", user="w").json()
    create(http, input="two", previous_response_id=first["id"])
    app = http.app
    repo = app.state.services.config.repo  # type: ignore[attr-defined]
    from flowstate.store.responses import StoredResponse
    stored = repo.responses.get(first["id"], "")
    # a response kept from before its session was deleted (what a database written by an older version may hold)
    repo.delete_session("w")
    repo.responses.save(StoredResponse(stored.id, "", stored.session, stored.position, stored.body, []), 1)
    r = create(http, input="three", previous_response_id=first["id"])
    assert r.status_code == 404 and "session that was deleted" in r.json()["error"]["message"], r.text
