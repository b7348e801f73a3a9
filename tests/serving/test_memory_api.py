"""What the console reads, through a real server on both databases: the key's sessions a page at a time (newest
activity first, filtered by name), a session's requests with their run records, a running turn while it runs, the
memory search with every bad input a 4xx, and the console's files with their policy — all per key."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import add, output
from tests.serving.conftest import Server, lines
from tests.serving.test_chat import client

KEYS = ("--api-key", "key-one", "--api-key", "key-two", "--metrics-key", "metrics-key")
ONE = {"Authorization": "Bearer key-one"}
TWO = {"Authorization": "Bearer key-two"}


def trip() -> list[dict[str, Any]]:
    """The "[trip]" turn: a preference, a judgement that it supports, and an update of a state that is not there
    (rejected)."""
    return lines("[trip]", [
        output(delta=[add("pref_quiet", "preference", note="quiet rooms in Lisbon"),
                      add("dec_hotel", "judgement", refs=[("supports", "pref_quiet")], hotel="Baixa"),
                      {"operation": "update", "state_id": "ghost", "summary": "nothing to update"}],
               content="Noted: a quiet hotel in Lisbon."),
    ])


def script() -> list[dict[str, Any]]:
    out = trip()
    out += lines("[later]", [output(focus=["dec_hotel"]),
                             output(delta=[add("dec_keep", "judgement", refs=[("supersedes", "dec_hotel")], keep=True)],
                                    content="Keep the Baixa.")])
    out += lines("[other]", [output(delta=[add("secret_plan", "judgement", plan="Lisbon hotel heist")], content="ok")])
    out += [{"text": output(content=f"answer {i}"), "when": f"[bulk {i}]"} for i in range(7)]
    return out


def chat(url: str, key: str, user: str, text: str) -> None:
    client(url, key).chat.completions.create(model="flowstate", user=user,
                                             messages=[{"role": "user", "content": text}])


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """One server a database for the module's read-only tests, with its sessions made once."""
    server = Server(tmp_path_factory.mktemp("memory-api"))
    if request.param == "postgres":
        server.db = request.getfixturevalue("pg_server").new_database()  # type: ignore[assignment]
    try:
        url = server.start(script(), *KEYS)
        chat(url, "key-one", "trip", "[trip] find me a quiet hotel in Lisbon")
        chat(url, "key-one", "trip", "[later] still happy with it?")
        chat(url, "key-two", "trip", "[other] my plan")
        for i in range(7):
            chat(url, "key-one", f"bulk-{i}", f"[bulk {i}] hi")
        yield server, url
    finally:
        server.stop()


def get(url: str, path: str, headers: dict[str, str] = ONE, **params: Any) -> httpx.Response:
    return httpx.get(url + path, headers=headers, params=params, timeout=30)


def test_sessions_pages_and_filters(served: tuple[Server, str]) -> None:
    _, url = served
    first = get(url, "/sessions", limit=3).json()
    assert [s["id"] for s in first["data"]] == ["bulk-6", "bulk-5", "bulk-4"] and first["has_more"]
    seen = [s["id"] for s in first["data"]]
    after = first["last_id"]
    while after:
        page = get(url, "/sessions", limit=3, after=after).json()
        seen += [s["id"] for s in page["data"]]
        after = page["last_id"] if page["has_more"] else None
    assert seen == [f"bulk-{i}" for i in range(6, -1, -1)] + ["trip"]  # every session once, newest activity first
    trip = get(url, "/sessions", name="TRI").json()["data"]
    assert len(trip) == 1 and trip[0]["id"] == "trip"
    row = trip[0]
    assert (row["requests"], row["states"], row["strategy"], row["running"]) == (2, 3, "flowstate", False)
    assert row["last_activity"] >= row["created_at"] > 1_700_000_000 and row["forked_from"] is None
    assert get(url, "/sessions", name="100%_").json()["data"] == []  # LIKE's wildcards are plain characters
    assert [s["id"] for s in get(url, "/sessions", headers=TWO).json()["data"]] == ["trip"]  # key two's own
    for bad in ({"limit": 0}, {"limit": 5000}, {"limit": "x"}, {"name": "n" * 300}):
        r = get(url, "/sessions", **bad)
        assert r.status_code in (400, 422) and "error" in r.json() or "detail" in r.json(), bad


def test_a_request_and_its_record(served: tuple[Server, str]) -> None:
    _, url = served
    session = get(url, "/sessions/trip").json()
    assert session["forks"] == [] and session["running"] is None
    assert [r["strategy"] for r in session["requests"]] == ["flowstate", "flowstate"]
    req = get(url, "/sessions/trip/requests/1").json()
    assert req["object"] == "session.request" and req["query"].startswith("[trip]")
    step = req["record"]["steps"][0]
    assert [c["state_id"] for c in step["committed"]] == ["pref_quiet", "dec_hotel"]
    assert step["rejected"][0]["state_id"] == "ghost" and step["rejected"][0]["reason"]
    assert "session" not in req["record"]  # the key's namespace stays inside the server
    later = get(url, "/sessions/trip/requests/2").json()["record"]["steps"]
    assert later[0]["disclosed"] == ["dec_hotel"]
    for path in ("/sessions/trip/requests/3", "/sessions/nobody/requests/1"):
        r = get(url, path)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", path
    assert get(url, "/sessions/trip/requests/0").status_code == 422  # no request 0: requests count from 1
    theirs = get(url, "/sessions/trip/requests/1", headers=TWO).json()  # key two's own "trip": one request
    assert theirs["query"] == "[other] my plan" and "pref_quiet" not in str(theirs)
    assert get(url, "/sessions/trip/requests/2", headers=TWO).status_code == 404
    assert "secret_plan" not in get(url, "/sessions/trip/requests/1").text
    assert get(url, "/sessions/trip/requests/x").status_code == 422


def test_a_session_with_its_graph_layout_and_typed_parameters(served: tuple[Server, str]) -> None:
    """The session route's layout is the graph page's, its parameters are typed and an unknown one is refused; the
    published schema names each route's response model and parameters."""
    _, url = served
    plain = get(url, "/sessions/trip").json()
    assert plain["layout"] is None and plain["id"] == "trip" and plain["object"] == "session"
    laid = get(url, "/sessions/trip", layout="true").json()
    assert {k: v for k, v in laid.items() if k != "layout"} == {k: v for k, v in plain.items() if k != "layout"}
    spots = {n["id"]: (n["x"], n["y"]) for n in laid["layout"]["nodes"]}
    assert set(spots) == {n["id"] for n in plain["nodes"]}
    assert [c["index"] for c in laid["layout"]["columns"]] == [1, 2]
    assert {(e["source"], e["target"], e["rel"]) for e in laid["layout"]["edges"]} == {
        ("dec_hotel", "pref_quiet", "supports"), ("dec_keep", "dec_hotel", "supersedes")}
    page = get(url, "/sessions/trip/graph").text
    for node_id, (x, y) in spots.items():
        assert f'data-id="{node_id}"' in page and f'<rect x="{x:g}" y="{y:g}"' in page.replace(".0\"", "\""), node_id
    for bad, status, code in (({"layout": "maybe"}, 422, "invalid_value"),
                              ({"layot": "true"}, 400, "unknown_parameter")):
        r = get(url, "/sessions/trip", **bad)
        assert r.status_code == status and r.json()["error"]["code"] == code, (bad, r.text)
    assert get(url, "/sessions", limt=3).json()["error"]["code"] == "unknown_parameter"
    for path in ("/sessions/trip/requests/1", "/sessions/trip/graph", "/sessions/trip/export"):
        assert get(url, path, verbose=1).json()["error"]["param"] == "verbose", path
    schema = httpx.get(url.removesuffix("/v1") + "/openapi.json", headers=ONE).json()
    paths = ("/v1/sessions", "/v1/sessions/{session_id}", "/v1/memory/search",
             "/v1/sessions/{session_id}/requests/{index}")
    ops = {path: schema["paths"][path]["get"] for path in paths}
    returns = {path: op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
               for path, op in ops.items()}
    assert returns == {"/v1/sessions": "SessionList", "/v1/sessions/{session_id}": "SessionViewOut",
                       "/v1/memory/search": "HitPage", "/v1/sessions/{session_id}/requests/{index}": "RequestView"}
    assert {p["name"] for p in ops["/v1/memory/search"]["parameters"]} == {
        "q", "type", "session", "since", "until", "limit", "after", "in"}
    assert {p["name"] for p in ops["/v1/sessions"]["parameters"]} == {"limit", "after", "name"}


def test_search_api(served: tuple[Server, str]) -> None:
    _, url = served
    found = get(url, "/memory/search", q="lisbon").json()
    assert [h["state_id"] for h in found["data"]] == ["pref_quiet"]
    hit = found["data"][0]
    assert (hit["session"], hit["request"], hit["type"], hit["kind"]) == ("trip", 1, "preference", "state")
    assert hit["created"] > 1_700_000_000 and hit["score"] > 0 and "summary" in hit
    assert [h["state_id"]
            for h in get(url, "/memory/search", headers=TWO, q="lisbon").json()["data"]] == ["secret_plan"]
    assert sorted(h["state_id"] for h in get(url, "/memory/search", q="summary", type="judgement").json()["data"]) == [
        "dec_hotel", "dec_keep"]
    page = get(url, "/memory/search", q="summary", limit=2).json()
    assert len(page["data"]) == 2 and page["has_more"]
    rest = get(url, "/memory/search", q="summary", limit=2, after=page["next"]).json()
    assert {h["state_id"] for h in rest["data"]}.isdisjoint(h["state_id"] for h in page["data"])
    assert get(url, "/memory/search", q="lisbon", session="trip", headers=TWO).json()["data"][0]["state_id"] == \
        "secret_plan"
    assert get(url, "/memory/search", q="heist", session="trip").json()["data"] == []  # never another key's


def test_the_shell_search_finds_what_the_api_finds(served: tuple[Server, str]) -> None:
    """``flowstate search`` on the server's database: the same hits, named as the key names them, in the same order."""
    from click.testing import CliRunner

    from flowstate.cli import main
    server, url = served
    for q, key, extra in (("lisbon", "key-one", []), ("summary", "key-one", ["--type", "judgement"]),
                          ("lisbon", "key-two", [])):
        shell = CliRunner().invoke(main, ["search", q, "--db", str(server.db), "--api-key", key, "--json", *extra])
        assert shell.exit_code == 0, shell.output
        params = {"q": q, **({"type": "judgement"} if extra else {})}
        api = get(url, "/memory/search", headers={"Authorization": f"Bearer {key}"}, **params).json()["data"]
        assert [(h["session"], h["state_id"]) for h in json.loads(shell.output)["data"]] == [
            (h["session"], h["state_id"]) for h in api], (q, key)
    bad = CliRunner().invoke(main, ["search", "lisbon", "--db", str(server.db), "--type", "nope"])
    assert bad.exit_code != 0 and "type: unknown 'nope'" in bad.output


@pytest.mark.parametrize("params", [
    {}, {"q": ""}, {"q": "x" * 10_000}, {"q": '"'}, {"q": "*"}, {"q": "-"}, {"q": "lisbon", "type": "nope"},
    {"q": "lisbon", "since": "last week"}, {"q": "lisbon", "until": "2026-02-30"}, {"q": "lisbon", "limit": "-1"},
    {"q": "lisbon", "limit": "1e9"}, {"q": "lisbon", "after": "garbage"}, {"q": "lisbon", "in": "files"},
    {"q": "lisbon", "bogus": "1"},
])
def test_bad_searches_are_4xx(served: tuple[Server, str], params: dict[str, str]) -> None:
    _, url = served
    r = get(url, "/memory/search", **params)
    assert r.status_code == 400, (params, r.text)
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["message"]


@pytest.mark.parametrize("q", ['"lisbon', "lisbon*", "NEAR(lisbon quiet)", "-lisbon", "lisbon:*", "lisbon & !x"])
def test_query_syntax_is_never_a_5xx(served: tuple[Server, str], q: str) -> None:
    _, url = served
    r = get(url, "/memory/search", q=q)
    expected = [] if q in ("NEAR(lisbon quiet)", "lisbon & !x") else ["pref_quiet"]  # "near" and "x" are words too
    assert r.status_code == 200 and [h["state_id"] for h in r.json()["data"]] == expected


def test_keys_and_the_console_files(served: tuple[Server, str]) -> None:
    _, url = served
    root = url.removesuffix("/v1")
    for headers in ({}, {"Authorization": "Bearer metrics-key"}, {"Authorization": "Bearer wrong"}):
        for path in ("/sessions", "/sessions/trip", "/sessions/trip/requests/1", "/memory/search?q=lisbon"):
            assert httpx.get(url + path, headers=headers).status_code == 401, (path, headers)
    page = httpx.get(root + "/ui/")
    assert page.status_code == 200 and "console.js" in page.text and "<script>" not in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
    assert httpx.get(root + "/ui/console.js").headers["content-type"].startswith("text/javascript")
    assert httpx.get(root + "/ui", follow_redirects=False).status_code == 308
    escaped = httpx.get(root + "/ui/../serving/app.py")  # out of /ui/: a path like any other, which needs a key
    assert escaped.status_code == 401 and "import" not in escaped.text
    assert httpx.get(root + "/ui/../serving/app.py", headers=ONE).status_code == 404
    assert httpx.get(root + "/ui/secrets.txt").status_code == 404


def test_a_running_turn_shows_while_it_runs(server: Server) -> None:
    slow = [{"text": output(tools=[{"name": "wait", "arguments": {"seconds": 3}}]), "when": "[slow]"},
            {"text": output(delta=[add("kn_waited", waited=True)], content="done waiting"), "when": "[slow]"}]
    url = server.start(slow, "--tools", "tests.serving.slow_tools:TOOLS")
    turn = threading.Thread(target=chat, args=(url, "none", "slowpoke", "[slow] wait a bit"))
    turn.start()
    running = None
    deadline = time.monotonic() + 20
    while running is None and time.monotonic() < deadline:
        r = httpx.get(url + "/sessions/slowpoke")
        running = r.json()["running"] if r.status_code == 200 else None
        time.sleep(0.1)
    assert running is not None and running["index"] == 1 and running["query"] == "[slow] wait a bit"
    turn.join(30)
    settled = httpx.get(url + "/sessions/slowpoke").json()
    assert settled["running"] is None and [r["response"] for r in settled["requests"]] == ["done waiting"]
