"""Feedback on the endpoint: given on a session's request or a stored response, per key (every piece kept, a key's
latest counting), read back, carried by the session file and gone with the session; another key's session or
response is not found, bad input is a 4xx (400, 422), and a refused request stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from engine.scripted import ScriptedEngine
from flowstate import Repository
from serving.app import create_app
from serving.services import ServerConfig
from tests.helpers import output

KEYS = {"a": {"Authorization": "Bearer key-a"}, "b": {"Authorization": "Bearer key-b"}}


@pytest.fixture
def served() -> Iterator[tuple[TestClient, Repository]]:
    engine = ScriptedEngine([output(content=f"answer {i}") for i in range(6)])
    with Repository.open(":memory:") as repo:
        with TestClient(create_app(ServerConfig(engine=engine, repo=repo, keys=("key-a", "key-b"))),
                        base_url="http://flowstate.test") as http:
            yield http, repo


def _chat(http: TestClient, key: str, session: str, text: str) -> Any:
    api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key=f"key-{key}", http_client=http, max_retries=0)
    return api.chat.completions.create(model="flowstate", user=session, messages=[{"role": "user", "content": text}])


def _stored(repo: Repository) -> int:
    return sum(len(repo.feedback.of(n)) for n in repo.sessions())


def test_feedback_on_a_request_is_kept_per_key_and_read_back(served: tuple[TestClient, Repository]) -> None:
    http, repo = served
    _chat(http, "a", "trip", "book me a hotel")
    url = "/v1/sessions/trip/requests/1/feedback"
    first = http.post(url, json={"score": -0.5, "comment": "wrong city"}, headers=KEYS["a"])
    assert first.status_code == 200 and first.json()["score"] == -0.5 and first.json()["request"] == 1
    assert http.post(url, json={"score": 1, "label": "fixed"}, headers=KEYS["a"]).status_code == 200
    listed = http.get(url, headers=KEYS["a"]).json()["data"]
    assert [p["score"] for p in listed] == [-0.5, 1.0] and listed[0]["comment"] == "wrong city"  # all kept
    full = next(n for n in repo.sessions() if n.endswith("trip"))
    assert repo.feedback.latest(full) == {1: 1.0}  # the key's latest counts
    entries, _ = repo.audit.entries(action="request.feedback")
    assert len(entries) == 2 and "wrong city" not in str([e.detail for e in entries])  # never the comment's text


def test_bad_feedback_is_a_4xx_and_another_keys_a_404_and_nothing_is_stored(served: tuple[TestClient,
                                                                                          Repository]) -> None:
    http, repo = served
    _chat(http, "a", "trip", "book me a hotel")
    url = "/v1/sessions/trip/requests/1/feedback"
    for body in ({"score": 2}, {"score": True}, {"comment": "no score"}, {"score": 0, "comment": "x" * 100_000},
                 {"score": 0, "extra": 1}, {"label": ""}):
        said = http.post(url, json=body, headers=KEYS["a"])
        assert said.status_code in (400, 422), (body, said.text)  # the endpoint's validation errors are 422s
        assert said.json()["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/sessions/trip/requests/9/feedback", json={"score": 1}, headers=KEYS["a"]).status_code == 404
    assert http.post(url, json={"score": 1}, headers=KEYS["b"]).status_code == 404  # b's "trip" does not exist
    assert http.get(url, headers=KEYS["b"]).status_code == 404
    assert _stored(repo) == 0


def test_feedback_on_a_stored_response_lands_on_its_request(served: tuple[TestClient, Repository]) -> None:
    http, repo = served
    api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key="key-a", http_client=http, max_retries=0)
    first = api.responses.create(model="flowstate", input="hello", user="chat")
    second = api.responses.create(model="flowstate", input="and then?", previous_response_id=first.id)
    given = http.post(f"/v1/responses/{second.id}/feedback", json={"label": "helpful"}, headers=KEYS["a"])
    assert given.status_code == 200 and given.json()["request"] == 2 and given.json()["response"] == second.id
    assert http.get(f"/v1/responses/{second.id}/feedback", headers=KEYS["a"]).json()["data"][0]["label"] == "helpful"
    assert http.post(f"/v1/responses/{second.id}/feedback", json={"score": 1}, headers=KEYS["b"]).status_code == 404
    assert _stored(repo) == 1


def test_feedback_travels_in_the_session_file_and_goes_with_its_session(served: tuple[TestClient, Repository]) -> None:
    http, repo = served
    _chat(http, "a", "trip", "book me a hotel")
    http.post("/v1/sessions/trip/requests/1/feedback", json={"score": -1, "comment": "no"}, headers=KEYS["a"])
    exported = http.get("/v1/sessions/trip/export", headers=KEYS["a"])
    assert exported.status_code == 200 and '"kind":"feedback"' in exported.text
    with Repository.open(":memory:") as other:
        other.transfer.load(exported.text.splitlines(keepends=True))
        assert [(f.request, f.score, f.comment) for f in other.feedback.of("trip")] == [(1, -1.0, "no")]
        assert other.feedback.by_session() == {"trip": [-1.0]}
    assert http.delete("/v1/sessions/trip", headers=KEYS["a"]).status_code in (200, 204)
    assert _stored(repo) == 0


def test_a_session_file_with_bad_feedback_is_refused_and_nothing_written(served: tuple[TestClient, Repository]) -> None:
    http, _ = served
    _chat(http, "a", "trip", "book me a hotel")
    http.post("/v1/sessions/trip/requests/1/feedback", json={"score": -1}, headers=KEYS["a"])
    text = http.get("/v1/sessions/trip/export", headers=KEYS["a"]).text.replace('"score":-1.0', '"score":5')
    from flowstate.store.transfer import BadSessionFile

    with Repository.open(":memory:") as other:
        with pytest.raises(BadSessionFile, match=r"\(feedback\): score is a number from -1 to 1"):
            other.transfer.load(text.splitlines(keepends=True))
        assert other.sessions() == []

