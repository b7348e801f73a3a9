"""A session's page polls cheaply: ``GET /v1/sessions/{id}`` carries an ``ETag`` (the session's version and what
runs in it now); sent back in ``If-None-Match`` it is a 304 with no body while nothing changed, and a new answer as
soon as a request, its states or a piece of feedback lands. Another key's session of the same name never matches."""

from __future__ import annotations

import httpx

from tests.serving.conftest import BOTH_DATABASES, Server
from tests.serving.test_tenants import notes, remember


def view(url: str, key: str, name: str, tag: str | None = None, layout: bool = True) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", **({"If-None-Match": tag} if tag else {})}
    return httpx.get(f"{url}/sessions/{name}", params={"layout": str(layout).lower()}, headers=headers, timeout=30)


@BOTH_DATABASES
def test_a_poll_of_an_unchanged_session_is_a_304_and_a_change_is_seen_at_once(server: Server) -> None:
    url = server.start(notes("[p]", 4), "--api-key", "k1", "--api-key", "k2")
    remember(url, "k1", "trip", "[p] first")
    remember(url, "k2", "trip", "[p] another key's trip")
    first = view(url, "k1", "trip")
    tag = first.headers["etag"]
    assert first.status_code == 200 and tag.startswith('"') and len(first.json()["requests"]) == 1
    again = view(url, "k1", "trip", tag)
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == tag
    assert view(url, "k1", "trip", f'"other", {tag}').status_code == 304  # a list of tags: any one matches
    assert view(url, "k1", "trip", tag, layout=False).status_code == 200  # another view of it: another tag
    other = view(url, "k2", "trip")
    assert other.headers["etag"] != tag and view(url, "k2", "trip", tag).status_code == 200  # another key's trip

    remember(url, "k1", "trip", "[p] second")  # a request lands: the next poll sees it
    changed = view(url, "k1", "trip", tag)
    assert changed.status_code == 200 and len(changed.json()["requests"]) == 2
    tag = changed.headers["etag"]
    given = httpx.post(f"{url}/sessions/trip/requests/1/feedback", headers={"Authorization": "Bearer k1"},
                       json={"score": 1}, timeout=30)
    assert given.status_code == 200, given.text
    fed = view(url, "k1", "trip", tag)  # feedback on a request: seen too
    assert fed.status_code == 200 and fed.json()["requests"][0]["feedback"][0]["score"] == 1
    assert view(url, "k1", "trip", fed.headers["etag"]).status_code == 304
    assert httpx.delete(f"{url}/sessions/trip", headers={"Authorization": "Bearer k1"}, timeout=30).status_code == 200
    assert view(url, "k1", "trip", fed.headers["etag"]).status_code == 404  # gone: never a 304
