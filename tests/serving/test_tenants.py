"""Tenants and keys as an operator uses them, on real servers with the official ``openai`` client: an admin makes a
tenant and a key, the tenant's agent remembers under it, a key is rotated under traffic (every turn inside the grace
period succeeds, then 401, the memory all readable with the new key), a key revoked on one server is refused by a
second on the same PostgreSQL within the bound, a revoked key's turn in flight finishes, static keys of before keep
their sessions, the shell does what the routes do, and bad input is a clear 4xx that stores nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from flowstate import Repository
from serving.tenancy import KEY_CACHE_S
from tests.helpers import add, output
from tests.serving.conftest import BOTH_DATABASES, Server, lines
from tests.serving.test_chat import client

ADMIN = "adm-secret-0123456789"
SLOW = ("--tools", "tests.serving.slow_tools:TOOLS")


def admin(url: str, method: str, path: str, key: str = ADMIN, **body: Any) -> httpx.Response:
    return httpx.request(method, f"{url}/admin{path}", headers={"Authorization": f"Bearer {key}"},
                         json=body or None, timeout=30)


def tenant_with_key(url: str, name: str) -> tuple[str, str, str]:
    """A new tenant's id, its first key's id and secret."""
    made = admin(url, "POST", "/tenants", name=name)
    assert made.status_code == 201, made.text
    key = admin(url, "POST", f"/tenants/{made.json()['id']}/keys")
    assert key.status_code == 201, key.text
    return made.json()["id"], key.json()["id"], key.json()["secret"]


def remember(url: str, key: str, session: str, text: str) -> Any:
    return client(url, key).chat.completions.create(model="flowstate", messages=[{"role": "user", "content": text}],
                                                    user=session)


def notes(marker: str, n: int) -> list[dict[str, Any]]:
    return lines(marker, [output(delta=[add(f"note_{i}", i=i)], content=f"noted {i}") for i in range(n)])


@BOTH_DATABASES
def test_an_admin_makes_a_tenant_whose_key_remembers_and_nothing_else_crosses(server: Server) -> None:
    url = server.start(notes("[acme]", 2) + notes("[beta]", 1), "--admin-key", ADMIN)
    acme, acme_key_id, acme_key = tenant_with_key(url, "acme")
    beta, _, beta_key = tenant_with_key(url, "beta")
    assert acme_key.startswith("fs-") and acme != beta
    remember(url, acme_key, "trip", "[acme] remember")
    remember(url, beta_key, "trip", "[beta] remember")  # the same session name, another tenant's
    acme_client, beta_client = client(url, acme_key), client(url, beta_key)
    assert [n["id"] for n in acme_client.get("/sessions/trip", cast_to=object)["nodes"]] == ["note_0"]
    assert [n["id"] for n in beta_client.get("/sessions/trip", cast_to=object)["nodes"]] == ["note_0"]
    assert remember(url, acme_key, "trip", "[acme] again").model_extra["flowstate"]["request"] == 2

    listed = admin(url, "GET", "/tenants").json()["data"]
    assert [(t["id"], t["name"]) for t in listed] == [(acme, "acme"), (beta, "beta")]
    keys = admin(url, "GET", f"/tenants/{acme}/keys").json()["data"]
    assert [k["id"] for k in keys] == [acme_key_id] and all(k["secret"] is None for k in keys)  # shown once only
    # an admin key manages; it reads no tenant's memory; a tenant's key never reaches an admin route
    for path in ("/sessions", "/sessions/trip", "/models"):
        refused = httpx.get(url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error", path
    with pytest.raises(openai.PermissionDeniedError):
        remember(url, ADMIN, "trip", "[acme] as the operator")
    assert admin(url, "GET", "/tenants", key=acme_key).status_code == 403
    assert admin(url, "POST", "/tenants", key=acme_key, name="mine").status_code == 403
    assert [t["name"] for t in admin(url, "GET", "/tenants").json()["data"]] == ["acme", "beta"]  # nothing made
    # the database keeps digests: no secret is in it
    if isinstance(server.db, Path):
        stored = b"".join(p.read_bytes() for p in server.db.parent.glob(server.db.name + "*"))
        assert acme_key.encode() not in stored and beta_key.encode() not in stored and ADMIN.encode() not in stored


def test_a_key_rotated_under_traffic_works_through_its_grace_then_stops(server: Server) -> None:
    url = server.start(notes("[rot]", 400), "--admin-key", ADMIN)
    _, key_id, old = tenant_with_key(url, "rotating")
    sent: list[tuple[float, int]] = []
    stop = threading.Event()

    def traffic() -> None:  # a client that keeps its old key and keeps working
        i = 0
        while not stop.is_set() and i < 300:
            r = httpx.post(url + "/chat/completions", headers={"Authorization": f"Bearer {old}"}, timeout=30,
                           json={"model": "flowstate", "user": "steady",
                                 "messages": [{"role": "user", "content": f"[rot] turn {i}"}]})
            sent.append((time.monotonic(), r.status_code))
            i += 1
            time.sleep(0.05)

    worker = threading.Thread(target=traffic)
    worker.start()
    time.sleep(1.0)
    grace = 3
    rotated = admin(url, "POST", f"/keys/{key_id}/rotate", grace_s=grace)
    turned = time.monotonic()
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["new"]["secret"]
    assert rotated.json()["old"]["expires_at"] is not None and rotated.json()["new"]["replaces"] == key_id
    deadline = turned + grace + KEY_CACHE_S + 3
    while time.monotonic() < deadline and not (sent and sent[-1][1] == 401):
        time.sleep(0.1)
    stop.set()
    worker.join(60)
    during = [status for at, status in sent if at < turned + grace - 0.5]
    after = [status for at, status in sent if at > turned + grace + KEY_CACHE_S + 1]
    assert during and set(during) == {200}, sorted(set(during))  # every turn inside the grace period succeeded
    assert sent[-1][1] == 401 and set(after) <= {401}
    ok = sum(status == 200 for _, status in sent)
    session = client(url, new).get("/sessions/steady", cast_to=object)  # the new key reads all of it
    assert len(session["requests"]) == ok  # every answered turn stored once, none twice, none lost
    with pytest.raises(openai.AuthenticationError):
        remember(url, old, "steady", "[rot] once more")


@pytest.mark.slow
def test_a_key_revoked_on_one_server_is_refused_by_the_other_within_the_bound(
        two_servers: tuple[Server, Server]) -> None:
    url_a, url_b = (s.start(notes("[two]", 50), "--admin-key", ADMIN) for s in two_servers)
    _, key_id, secret = tenant_with_key(url_a, "shared")  # made on a ...
    assert remember(url_b, secret, "s", "[two] on b").choices[0].message.content == "noted 0"  # ... used on b
    assert admin(url_b, "GET", "/tenants").json()["data"][0]["name"] == "shared"
    revoked = admin(url_a, "DELETE", f"/keys/{key_id}")
    at = time.monotonic()
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    with pytest.raises(openai.AuthenticationError):
        remember(url_a, secret, "s", "[two] on a")  # the server that revoked it: at once
    while True:  # every request b gets after the bound is refused, however loaded the machine
        sent = time.monotonic()
        r = httpx.get(url_b + "/sessions", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
        if r.status_code == 401:
            break
        assert r.status_code == 200 and sent - at < KEY_CACHE_S + 0.1, f"b took the key {sent - at:.2f} s after"
        time.sleep(0.05)


def test_a_revoked_keys_turn_in_flight_finishes_and_its_next_is_refused(server: Server) -> None:
    slow = [{"text": output(tools=[{"name": "wait", "arguments": {"seconds": 3}}]), "when": "[slow]"},
            {"text": output(delta=[add("kn_waited", waited=True)], content="done waiting"), "when": "[slow]"}]
    url = server.start(slow, "--admin-key", ADMIN, *SLOW)
    tenant, key_id, secret = tenant_with_key(url, "inflight")
    got: dict[str, Any] = {}
    turn = threading.Thread(target=lambda: got.update(r=remember(url, secret, "long", "[slow] wait a bit")))
    turn.start()
    time.sleep(1.0)
    assert admin(url, "DELETE", f"/keys/{key_id}").status_code == 200
    turn.join(60)
    assert got["r"].choices[0].message.content == "done waiting"  # admitted before the revocation: it finishes
    with Repository.open(server.db) as repo:  # and is stored, under its tenant
        assert [r.response for r in repo.requests(f"{tenant}/long")] == ["done waiting"]
    with pytest.raises(openai.AuthenticationError):
        remember(url, secret, "long", "[slow] again")


def test_static_keys_keep_their_sessions_and_become_manageable(server: Server) -> None:
    url = server.start(notes("[old]", 3), "--api-key", "legacy-key")
    remember(url, "legacy-key", "before", "[old] from before tenants")
    server.stop()
    url = server.start(notes("[old]", 3), "--api-key", "legacy-key", "--admin-key", ADMIN)
    legacy = client(url, "legacy-key")
    assert [s["id"] for s in legacy.get("/sessions", cast_to=object)["data"]] == ["before"]  # nothing lost
    [tenant] = admin(url, "GET", "/tenants").json()["data"]
    [key] = admin(url, "GET", f"/tenants/{tenant['id']}/keys").json()["data"]
    rotated = admin(url, "POST", f"/keys/{key['id']}/rotate", grace_s=0).json()
    time.sleep(KEY_CACHE_S + 0.2)
    with pytest.raises(openai.AuthenticationError):  # rotated out, though the server was given it
        legacy.get("/sessions", cast_to=object)
    assert [s["id"]
            for s in client(url, rotated["new"]["secret"]).get("/sessions", cast_to=object)["data"]] == ["before"]
    server.stop()  # a restart with the same --api-key does not bring the rotated key back
    url = server.start(notes("[old]", 3), "--api-key", "legacy-key", "--admin-key", ADMIN)
    with pytest.raises(openai.AuthenticationError):
        client(url, "legacy-key").get("/sessions", cast_to=object)


def flowstate(db: Path, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "flowstate.cli", *args, "--db", str(db)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_shell_manages_what_the_routes_do(server: Server) -> None:
    db = server.db
    made = flowstate(db, "tenants", "create", "shell-co", "--create")  # before any server: a new database
    key = flowstate(db, "keys", "create", made["id"])
    url = server.start(notes("[sh]", 2), "--admin-key", ADMIN)
    assert remember(url, key["secret"], "s", "[sh] hi").choices[0].message.content == "noted 0"
    assert [t["name"] for t in flowstate(db, "tenants", "list")] == ["shell-co"]
    rotated = flowstate(db, "keys", "rotate", key["id"], "--grace", "0")
    assert rotated["new"]["replaces"] == key["id"] and "secret" not in rotated["old"]
    flowstate(db, "keys", "revoke", rotated["new"]["id"])
    time.sleep(KEY_CACHE_S + 0.2)  # the running server sees the shell's change within the bound
    for secret in (key["secret"], rotated["new"]["secret"]):
        with pytest.raises(openai.AuthenticationError):
            remember(url, secret, "s", "[sh] again")
    listed = flowstate(db, "keys", "list", made["id"])
    assert [k["revoked_at"] is not None for k in listed] == [False, True] and "secret" not in json.dumps(listed)
    refused = subprocess.run([sys.executable, "-m", "flowstate.cli", "tenants", "create", "shell-co", "--db", str(db)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "exists" in refused.stderr


CREDENTIALS = [None, "", "Bearer", f"Bearer:{ADMIN}", "Basic YWRtOnB3", "Token abc", "bearer", "Bearer wrong",
               f"Bearer {ADMIN}x", f"Bearer {ADMIN[:-1]}", f"Basic {ADMIN}", f"{ADMIN}", f"Bearer  {ADMIN}",
               "Bearer fs-" + "A" * 43, "Bearer fs-", "Bearer %C3%A9t%C3%A9", "Bearer " + "x" * 5000,
               "Bearer key_00000000000000000000", "Bearer k0123456789abcdef", "Bearer null"]


def test_bad_input_is_a_clear_4xx_and_stores_nothing(server: Server) -> None:
    url = server.start(notes("[bad]", 1), "--admin-key", ADMIN)
    tenant, key_id, secret = tenant_with_key(url, "careful")
    cases = [
        (("POST", "/tenants"), {"name": "careful"}, 409),  # a duplicate name
        (("POST", "/tenants"), {"name": ""}, 422), (("POST", "/tenants"), {"name": "a/b"}, 400),
        (("POST", "/tenants"), {"name": "x" * 500}, 422), (("POST", "/tenants"), {"nme": "typo"}, 422),
        (("POST", "/tenants/t000/keys"), {}, 404),  # an unknown tenant
        (("POST", f"/tenants/{tenant}/keys"), {"expires_in": -5}, 422),
        (("POST", f"/tenants/{tenant}/keys"), {"expires_in": 10**12}, 422),
        (("POST", f"/keys/{key_id}/rotate"), {"grace_s": -1}, 422),
        (("POST", f"/keys/{key_id}/rotate"), {"grace_s": 10**9}, 422),
        (("POST", "/keys/key_000000000000000000000000/rotate"), {}, 404),
        (("DELETE", "/keys/key_000000000000000000000000"), {}, 404), (("DELETE", "/keys/nonsense"), {}, 400),
    ]
    for (method, path), body, status in cases:
        r = admin(url, method, path, **body)
        assert r.status_code == status, (method, path, body, r.text)
        assert r.json()["error"]["message"], r.text
    for authorization in CREDENTIALS:  # 20 forms of credential that prove nothing
        headers = {} if authorization is None else {"Authorization": authorization}
        for method, path in (("POST", "/admin/tenants"), ("GET", "/admin/tenants"), ("POST", "/chat/completions")):
            r = httpx.request(method, url + path, headers=headers, json={"name": "intruder"}, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (authorization, path)
    expiring = admin(url, "POST", f"/tenants/{tenant}/keys", expires_in=60).json()
    with sqlite3.connect(server.db) as db:  # as if its minute had passed
        db.execute("UPDATE api_keys SET expires_at = 1 WHERE id = ?", (expiring["id"],))
    time.sleep(KEY_CACHE_S + 0.2)
    r = httpx.get(url + "/sessions", headers={"Authorization": f"Bearer {expiring['secret']}"}, timeout=30)
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    assert [t["name"] for t in admin(url, "GET", "/tenants").json()["data"]] == ["careful"]  # nothing stored
    assert len(admin(url, "GET", f"/tenants/{tenant}/keys").json()["data"]) == 2
    assert client(url, secret).get("/sessions", cast_to=object)["data"] == []


def test_a_json_body_is_read_whatever_content_type_it_declares(server: Server) -> None:
    """``curl -d '{…}'`` declares a form (application/x-www-form-urlencoded): the body is read as the JSON it is, as
    it is with text/plain or no type at all; a body that is not JSON is refused as such and stores nothing."""
    url = server.start(notes("[x]", 1), "--admin-key", ADMIN)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    for n, declared in enumerate(["application/x-www-form-urlencoded", "text/plain; charset=utf-8", None]):
        headers = {**auth, **({"Content-Type": declared} if declared else {})}
        made = httpx.post(f"{url}/admin/tenants", headers=headers, content=json.dumps({"name": f"team-{n}"}))
        assert made.status_code == 201, (declared, made.text)
        key = httpx.post(f"{url}/admin/tenants/{made.json()['id']}/keys", headers=headers,
                         content=json.dumps({"expires_in": 600}))
        assert key.status_code == 201 and key.json()["expires_at"] - key.json()["created_at"] == 600, key.text
    bad = httpx.post(f"{url}/admin/tenants", headers={**auth, "Content-Type": "application/x-www-form-urlencoded"},
                     content="name=team-3")
    assert bad.status_code in (400, 422) and "json" in bad.text.lower(), bad.text
    assert [t["name"] for t in admin(url, "GET", "/tenants").json()["data"]] == ["team-0", "team-1", "team-2"]
    done = subprocess.run(["curl", "-s", "-H", f"Authorization: Bearer {ADMIN}", f"{url}/admin/tenants",
                           "-d", '{"name": "by-curl"}'], capture_output=True, text=True, timeout=30)
    assert json.loads(done.stdout)["name"] == "by-curl", done.stdout


@BOTH_DATABASES
def test_the_list_of_tenants_says_what_an_operator_watches_and_a_key_shows_only_its_hint(server: Server) -> None:
    url = server.start(notes("[acme]", 2), "--admin-key", ADMIN, "--api-key", "static-key-of-before")
    acme, key_id, secret = tenant_with_key(url, "acme")
    assert admin(url, "PATCH", f"/tenants/{acme}", quota={"requests_per_minute": 50}).status_code == 200
    made = admin(url, "GET", f"/tenants/{acme}/keys").json()["data"][0]
    assert made["hint"] == "fs-…" + secret[-4:] and made["state"] == "active" and made["last_used_at"] is None
    assert secret not in json.dumps(admin(url, "GET", "/tenants").json())

    before = int(time.time())
    remember(url, secret, "trip", "[acme] remember")
    remember(url, secret, "plans", "[acme] again")
    listed = {t["id"]: t for t in admin(url, "GET", "/tenants").json()["data"]}
    row = listed[acme]
    assert row["sessions"] == 2 and row["keys"] == 1
    assert row["usage"]["requests_this_minute"] in (1, 2)  # two requests, unless a minute turned between them
    assert row["usage"]["tokens_today"] > 0 and row["usage"]["running_turns"] == 0
    static = next(t for t in listed.values() if t["id"] != acme)  # the static key's tenant, adopted at start
    assert static["sessions"] == 0 and static["keys"] == 1
    static_key = admin(url, "GET", f"/tenants/{static['id']}/keys").json()["data"][0]
    assert static_key["hint"] is None  # an operator's own secret: no part of it shown

    used = admin(url, "GET", f"/tenants/{acme}/keys").json()["data"][0]
    assert before - 1 <= used["last_used_at"] <= time.time() + 1  # written once, on the first use
    assert admin(url, "DELETE", f"/keys/{key_id}").json()["state"] == "revoked"
    row = next(t for t in admin(url, "GET", "/tenants").json()["data"] if t["id"] == acme)
    assert row["keys"] == 0
