"""Numbers and policies no route should take, on real servers: every duration, count and index an admin, erasure,
feedback or session route takes is bounded to what the databases store and refused beyond (422 naming the field,
nothing stored, never a 5xx); a tenant's stored policy that no sweep can read keeps that tenant's memory and stops
no other tenant's sweep; a PATCH of a quota merges; a request without a key is a 401 whatever else it sends; an
admin key reads /openapi.json."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.flowstate.test_repository import raw
from tests.serving.conftest import BOTH_DATABASES, Server
from tests.serving.test_retention import SWEEPING, age, chat, gone
from tests.serving.test_tenants import ADMIN, admin, notes, tenant_with_key

HUGE = [10**20, 2**63, 2**31, -1, 0, True, 1.5, "5", None]
DURATIONS = ["idle=99999999999999999999d", "idle=36501d", "age=9999999w", "idle=0d", "idle=", "", "idle=30d,idle=2d",
             "idle=30x", "idle=-3d", "off,idle=3d", "x" * 5000]


def tenants(url: str) -> list[str]:
    return [t["name"] for t in admin(url, "GET", "/tenants").json()["data"]]


@BOTH_DATABASES
def test_admin_routes_refuse_numbers_and_policies_they_cannot_store(server: Server) -> None:
    url = server.start(notes("[n]", 1), "--admin-key", ADMIN)
    tenant, key_id, _ = tenant_with_key(url, "acme")
    for policy in DURATIONS:
        for made in (admin(url, "POST", "/tenants", name="new", retention=policy),
                     admin(url, "PATCH", f"/tenants/{tenant}", retention=policy)):
            assert made.status_code == 422 and "retention" in made.text, (policy, made.status_code, made.text[:200])
    for value in HUGE:
        for field in ("requests_per_minute", "concurrent_turns", "tokens_per_day"):
            if value is None or (field == "tokens_per_day" and value == 2**31):  # a day's tokens may pass 2^31
                continue
            made = admin(url, "POST", "/tenants", name="new", quota={field: value})
            assert made.status_code == 422 and field in made.text, (field, value, made.text[:200])
        if value is not None:
            assert admin(url, "POST", f"/tenants/{tenant}/keys", expires_in=value).status_code == 422, value
            if value != 0:  # a grace of 0 ends the old key now
                assert admin(url, "POST", f"/keys/{key_id}/rotate", grace_s=value).status_code == 422, value
    assert tenants(url) == ["acme"]  # nothing refused was stored
    assert admin(url, "POST", "/tenants", name="kept", retention="idle=36500d").status_code == 201  # the bound


@BOTH_DATABASES
def test_a_quota_patch_merges_and_null_clears(server: Server) -> None:
    url = server.start(notes("[n]", 1), "--admin-key", ADMIN)
    made = admin(url, "POST", "/tenants", name="acme", quota={"requests_per_minute": 600, "concurrent_turns": 8})
    tenant = made.json()["id"]
    changed = admin(url, "PATCH", f"/tenants/{tenant}", quota={"requests_per_minute": 1200})
    assert changed.json()["quota"] == {"requests_per_minute": 1200, "concurrent_turns": 8, "tokens_per_day": None}
    changed = admin(url, "PATCH", f"/tenants/{tenant}", quota={"concurrent_turns": None, "tokens_per_day": 9})
    assert changed.json()["quota"] == {"requests_per_minute": 1200, "concurrent_turns": None, "tokens_per_day": 9}
    assert admin(url, "PATCH", f"/tenants/{tenant}", retention="idle=7d").json()["quota"]["requests_per_minute"] == 1200


def test_request_indexes_past_what_a_database_holds_are_refused(server: Server) -> None:
    url = server.start(notes("[n]", 2))
    chat(url, "trip", "[n] remember")
    headers = {"Authorization": "Bearer k"}
    for index in ("9223372036854775808", str(2**31), "0", "-1", "1e3", "x"):
        for method, path in (("GET", f"/sessions/trip/requests/{index}"),
                             ("GET", f"/sessions/trip/requests/{index}/feedback"),
                             ("POST", f"/sessions/trip/requests/{index}/feedback")):
            got = httpx.request(method, url + path, headers=headers, json={"score": 1} if method == "POST" else None,
                                timeout=30)
            assert got.status_code == 422 and "index" in got.text, (method, path, got.status_code, got.text[:200])
    for method in ("GET", "POST"):  # a request the session does not have: 404 both ways, as the POST always was
        got = httpx.request(method, f"{url}/sessions/trip/requests/99999/feedback", headers=headers,
                            json={"score": 1} if method == "POST" else None, timeout=30)
        assert got.status_code == 404 and "request_not_found" in got.text, (method, got.text)
    assert httpx.get(f"{url}/sessions/trip/requests/1/feedback", headers=headers, timeout=30).status_code == 200
    erased = httpx.post(f"{url}/erasure", headers=headers, json={"subject": "trip", "wait_s": True}, timeout=30)
    assert erased.status_code == 422 and "wait_s" in erased.text
    assert httpx.get(f"{url}/sessions/trip", headers=headers, timeout=30).status_code == 200  # nothing erased


def test_without_a_key_it_is_401_whatever_else_the_request_says_and_an_admin_reads_the_api(server: Server) -> None:
    url = server.start(notes("[n]", 1), "--admin-key", ADMIN)
    _, _, secret = tenant_with_key(url, "acme")
    for method, path in (("GET", "/sessions?limt=3"), ("GET", "/sessions?limit=abc"), ("GET", "/usage?x=1"),
                         ("GET", "/sessions/s/requests/99999999999999999999"), ("POST", "/erasure"),
                         ("GET", "/memory/search?q=a&nope=1"), ("POST", "/chat/completions")):
        for auth in ({}, {"Authorization": "Bearer not-a-key"}):
            got = httpx.request(method, url + path, headers=auth, content=b"{not json", timeout=30)
            assert got.status_code == 401, (method, path, auth, got.status_code, got.text[:200])
    keyed = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{url}/usage?x=1", headers=keyed, timeout=30).status_code == 400
    assert httpx.get(f"{url}/usage", headers=keyed, timeout=30).status_code == 200
    root = url.removesuffix("/v1")
    schema = httpx.get(f"{root}/openapi.json", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert schema.status_code == 200 and "/v1/admin/tenants" in schema.json()["paths"]
    assert httpx.get(f"{root}/openapi.json", timeout=30).status_code == 401
    assert httpx.get(f"{root}/health", timeout=30).status_code == 200
    assert httpx.get(f"{root}/ui/", timeout=30).status_code == 200


@BOTH_DATABASES
def test_a_tenants_unreadable_policy_keeps_its_memory_and_stops_no_other_sweep(server: Server) -> None:
    url = server.start(notes("[a]", 2) + notes("[b]", 2), *SWEEPING, "--admin-key", ADMIN, "--metrics-key", "mk")
    broken, _, broken_key = tenant_with_key(url, "broken")
    _, _, fine_key = tenant_with_key(url, "fine")
    chat(url, "old", "[a] remember", key=broken_key)
    chat(url, "old", "[b] remember", key=fine_key)
    # a policy written before its bounds were checked (or by hand): no sweep can read it
    raw(str(server.db), f"UPDATE tenants SET retention = 'idle=99999999999999999999d' WHERE id = '{broken}'")
    names = [r[0] for r in raw(str(server.db), "SELECT name FROM sessions")]
    for name in names:
        age(server.db, name, 400)
    assert gone(url, "old", key=fine_key)  # the other tenant's expired session went
    time.sleep(2.5)  # sweeps went on past the unreadable row
    kept = httpx.get(f"{url}/sessions/old", headers={"Authorization": f"Bearer {broken_key}"}, timeout=30)
    assert kept.status_code == 200  # its own memory is kept, not swept by the server's policy
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics", headers={"Authorization": "Bearer mk"}, timeout=30).text
    assert "flowstate_retention_unreadable_policies 1.0" in metrics
    assert f"retention: tenant {broken}'s policy cannot be read, its memory is kept" in server.log.read_text()


def test_the_shell_refuses_a_bound_past_its_limit_and_an_empty_policy(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from flowstate.cli import main
    from flowstate.store.retention import PolicyError, parse_policy

    db = tmp_path / "m.db"
    run = CliRunner().invoke
    made = run(main, ["tenants", "create", "acme", "--db", str(db), "--create"])
    tenant = json.loads(made.output)["id"]
    refused = run(main, ["tenants", "retention", tenant, "idle=99999999999999999999d", "--db", str(db)])
    assert refused.exit_code != 0 and "36500d" in refused.output
    with pytest.raises(PolicyError):
        parse_policy("")
    assert str(parse_policy("idle=36500d")) == "idle=36500d" and not parse_policy("off")
