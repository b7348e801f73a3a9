"""The import route holds a session file's lines to the rule every body the endpoint takes is held to."""

from __future__ import annotations

from flowstate import Repository
from tests.serving.test_feedback import KEYS, TestClient, _chat, served

__all__ = ["served"]


def test_the_import_route_refuses_json_nested_past_its_rule(served: tuple[TestClient, Repository]) -> None:
    """Every body the endpoint takes nests at most 64 levels (serving/chat/wire.py's MAX_DEPTH): a session file's lines
    too — a 400 naming the line, and nothing imported."""
    http, repo = served
    _chat(http, "a", "trip", "book me a hotel")
    text = http.get("/v1/sessions/trip/export", headers=KEYS["a"]).text
    deep = text.replace('"query":"book me a hotel"', '"query":' + "[" * 70 + "]" * 70, 1)
    said = http.post("/v1/sessions/import", headers=KEYS["b"], content=deep.encode())
    assert said.status_code == 400 and "levels deep: at most 64" in said.json()["error"]["message"], said.text
    assert len(repo.sessions()) == 1  # a's trip only
    assert http.get("/v1/sessions/trip", headers=KEYS["b"]).status_code == 404
