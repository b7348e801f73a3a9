"""The audit trail as an operator reads it: every admin action (tenants, quotas, keys) and data action (export,
import, delete, search) with its time, tenant, key id (never a secret), target and result — refusals recorded as
such — paged and filtered at ``/v1/admin/audit`` and by ``flowstate audit``; written in the action's transaction
(an action rolled back leaves no entry), append-only on both databases, and never in a session file."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from flowstate import Repository
from flowstate.errors import SessionHasForks, StorageError
from flowstate.store.audit import Entry, text_digest
from tests.serving.conftest import BOTH_DATABASES, Server
from tests.serving.test_quotas import tenant
from tests.serving.test_tenants import ADMIN, admin, notes


def trail(url: str, **params: Any) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/admin/audit", headers={"Authorization": f"Bearer {ADMIN}"}, params=params, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def as_tenant(url: str, key: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(method, url + path, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kw)


@BOTH_DATABASES
def test_every_admin_and_data_action_is_in_the_trail_with_who_and_how_it_ended(server: Server) -> None:
    url = server.start(notes("[a]", 3), "--admin-key", ADMIN)
    tenant_id, key = tenant(url, "audited", requests_per_minute=100)
    key_id = admin(url, "GET", f"/tenants/{tenant_id}/keys").json()["data"][0]["id"]
    assert admin(url, "POST", "/tenants", name="audited").status_code == 409  # refused: recorded as such
    assert admin(url, "PATCH", f"/tenants/{tenant_id}", quota={"concurrent_turns": 2}).status_code == 200
    as_tenant(url, key, "POST", "/chat/completions", json={"model": "flowstate", "user": "trip",
                                                           "messages": [{"role": "user", "content": "[a] hi"}]})
    assert as_tenant(url, key, "GET", "/memory/search", params={"q": "note"}).status_code == 200
    exported = as_tenant(url, key, "GET", "/sessions/trip/export")
    assert exported.status_code == 200
    assert as_tenant(url, key, "POST", "/sessions/import", content=exported.content,
                     params={"rename": "trip=copy"}).status_code == 200
    assert as_tenant(url, key, "POST", "/sessions/import", content=exported.content).status_code == 409
    assert as_tenant(url, key, "DELETE", "/sessions/copy").status_code == 200
    assert as_tenant(url, key, "DELETE", "/sessions/nowhere").status_code == 404
    rotated = admin(url, "POST", f"/keys/{key_id}/rotate", grace_s=0).json()
    assert admin(url, "DELETE", f"/keys/{rotated['new']['id']}").status_code == 200

    got = [(e["action"], e["target"], e["result"], e["actor"], e["tenant"]) for e in trail(url)]
    t = tenant_id
    assert got == [
        ("tenant.create", t, "ok", "admin", t), ("key.create", key_id, "ok", "admin", t),
        ("tenant.create", "audited", "refused", "admin", None), ("tenant.quota", t, "ok", "admin", t),
        ("memory.search", text_digest("note"), "ok", "tenant", t), ("session.export", "trip", "ok", "tenant", t),
        ("session.import", "copy", "ok", "tenant", t), ("session.import", "trip", "refused", "tenant", t),
        ("session.delete", "copy", "ok", "tenant", t), ("session.delete", "nowhere", "refused", "tenant", t),
        ("key.rotate", rotated["new"]["id"], "ok", "admin", t), ("key.revoke", rotated["new"]["id"], "ok", "admin", t),
    ], got
    entries = trail(url)
    assert {e["key"] for e in entries if e["actor"] == "tenant"} == {key_id}  # the key's id, never its secret
    assert all(e["key"].startswith("admin:") for e in entries if e["actor"] == "admin")
    assert "exists" in entries[2]["detail"]["reason"] and entries[-2]["detail"]["rotated"] == key_id
    everything = json.dumps(entries)
    assert key not in everything and rotated["new"]["secret"] not in everything and ADMIN not in everything
    # filters and pages
    assert [e["action"] for e in trail(url, action="session.delete")] == ["session.delete"] * 2
    assert trail(url, tenant="t-nobody") == []
    first = httpx.get(f"{url}/admin/audit", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30,
                      params={"limit": 5}).json()
    second = trail(url, limit=5, after=first["last_id"])
    assert first["has_more"] and [e["id"] for e in first["data"] + second] == [e["id"] for e in entries[:10]]
    assert trail(url, since=entries[-1]["at"]) == entries[-1:]
    assert trail(url, until=entries[1]["at"]) == [e for e in entries if e["at"] < entries[1]["at"]]
    assert {e["actor"] for e in trail(url, actor="tenant")} == {"tenant"}
    assert len(trail(url, actor="admin")) + len(trail(url, actor="tenant")) == len(entries)
    # who may read it, and bad parameters
    assert as_tenant(url, key.replace("fs-", "fs-x"), "GET", "/admin/audit").status_code == 401
    fresh = admin(url, "POST", f"/tenants/{tenant_id}/keys").json()["secret"]
    assert as_tenant(url, fresh, "GET", "/admin/audit").status_code == 403
    for params, status in (({"limit": 0}, 400), ({"action": "steal"}, 400), ({"actor": "root"}, 400),
                           ({"since": "yesterday"}, 422)):
        bad = httpx.get(f"{url}/admin/audit", headers={"Authorization": f"Bearer {ADMIN}"}, params=params, timeout=30)
        assert bad.status_code == status, (params, bad.text)
    # it stays with the server: a session file carries none of it
    assert b"aud_" not in exported.content and b"tenant.create" not in exported.content


def test_an_action_rolled_back_leaves_no_entry_and_the_trail_is_append_only(any_repo: Repository) -> None:
    entry = Entry("session.delete", "parent", "tenant", "key_1", "t1")
    any_repo.persist_request("t1/parent", 1, "q", "r", [], {})
    any_repo.lineage.fork("t1/parent", 1, "t1/child")
    with pytest.raises(SessionHasForks):  # refused inside its transaction: the entry goes with it
        any_repo.delete_session("t1/parent", entry)
    assert any_repo.audit.entries()[0] == []
    assert any_repo.delete_session("t1/child", Entry("session.delete", "child", "tenant", "key_1", "t1"))
    [kept], more = any_repo.audit.entries()
    assert (kept.target, kept.result, more) == ("child", "ok", False)
    for sql in ("UPDATE audit SET result = 'ok'", "DELETE FROM audit"):
        with pytest.raises(StorageError, match="append-only"), any_repo._write("tamper") as conn:
            conn.execute(sql)
    assert [e.id for e in any_repo.audit.entries()[0]] == [kept.id]


def test_the_shell_records_its_actions_and_reads_the_trail(server: Server) -> None:
    def flowstate(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "flowstate.cli", *args, "--db", str(server.db)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    made = json.loads(flowstate("tenants", "create", "shell-co", "--rpm", "5", "--create"))  # a new database
    key = json.loads(flowstate("keys", "create", made["id"]))
    flowstate("keys", "revoke", key["id"])
    lines = [json.loads(line) for line in flowstate("audit").splitlines()]
    assert [(e["action"], e["actor"], e["tenant"]) for e in lines] == [
        ("tenant.create", "shell", made["id"]), ("key.create", "shell", made["id"]),
        ("key.revoke", "shell", made["id"])]
    assert key["secret"] not in json.dumps(lines)
    assert [e["action"] for e in map(json.loads, flowstate("audit", "--action", "key.revoke").splitlines())] == \
        ["key.revoke"]


def test_an_admin_reads_a_tenants_memory_only_by_naming_it_and_every_read_is_recorded(server: Server) -> None:
    url = server.start(notes("[r]", 2), "--admin-key", ADMIN)
    tenant_id, key = tenant(url, "watched")
    as_tenant(url, key, "POST", "/chat/completions", json={"model": "flowstate", "user": "trip",
                                                           "messages": [{"role": "user", "content": "[r] hi"}]})
    operator = {"Authorization": f"Bearer {ADMIN}"}
    assert httpx.get(url + "/sessions", headers=operator, timeout=30).status_code == 403  # without saying whose
    named = {**operator, "X-FlowState-Tenant": tenant_id}
    listed = httpx.get(url + "/sessions", headers=named, timeout=30)
    assert listed.status_code == 200 and [s["id"] for s in listed.json()["data"]] == ["trip"]
    assert [n["id"] for n in httpx.get(url + "/sessions/trip", headers=named, timeout=30).json()["nodes"]] == ["note_0"]
    for method, path in (("POST", "/chat/completions"), ("DELETE", "/sessions/trip"), ("POST", "/sessions/import")):
        refused = httpx.request(method, url + path, headers=named, json={}, timeout=30)
        assert refused.status_code == 403, (method, path, refused.text)  # it reads; it changes nothing
    assert httpx.get(url + "/sessions", headers={**operator, "X-FlowState-Tenant": "t-nobody"},
                     timeout=30).status_code == 404
    stranger = {"Authorization": f"Bearer {key}", "X-FlowState-Tenant": "t-other"}  # a tenant's key: header ignored
    assert [s["id"] for s in httpx.get(url + "/sessions", headers=stranger, timeout=30).json()["data"]] == ["trip"]
    for _ in range(3):  # a page's polls: the same path read again within the minute is in the trail once
        assert httpx.get(url + "/sessions/trip", headers=named, timeout=30).status_code == 200
    assert httpx.get(url + "/sessions/trip?layout=true", headers=named, timeout=30).status_code == 200
    reads = trail(url, action="session.read")
    assert [(e["target"], e["tenant"], e["actor"]) for e in reads] == [
        ("/v1/sessions", tenant_id, "admin"), ("/v1/sessions/trip", tenant_id, "admin"),
        ("/v1/sessions/trip?layout=true", tenant_id, "admin")]
    assert as_tenant(url, key, "GET", "/sessions/trip").status_code == 200  # still the tenant's


def test_a_read_polled_for_long_is_in_the_trail_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Authenticated._read_again``: a path read again within the minute is not recorded again, one read past it is;
    each key and each tenant on its own; what is older than the minute is forgotten."""
    from serving import tenancy

    now = [1000.0]
    monkeypatch.setattr(tenancy.time, "monotonic", lambda: now[0])
    gate = tenancy.Authenticated(None, None)  # type: ignore[arg-type]
    assert not gate._read_again("k1", "t1", "/v1/sessions/a")
    for step in (1.5, 30.0, 59.0):
        now[0] = 1000.0 + step
        assert gate._read_again("k1", "t1", "/v1/sessions/a")
    assert not gate._read_again("k2", "t1", "/v1/sessions/a") and not gate._read_again("k1", "t2", "/v1/sessions/a")
    now[0] = 1061.0  # past a minute since it was recorded: recorded again, then a minute's silence
    assert not gate._read_again("k1", "t1", "/v1/sessions/a")
    assert gate._read_again("k1", "t1", "/v1/sessions/a")
    now[0] = 2000.0
    assert not gate._read_again("k9", "t9", "/v1/x") and list(gate._read) == [("k9", "t9", "/v1/x")]
