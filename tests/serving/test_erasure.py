"""Erasure on a real server with the official ``openai`` client: a tenant erases a subject that has a session, a fork
made by an earlier ``previous_response_id``, stored responses, a conversation whose metadata names it, a background
response and an idempotent retry; afterwards no list, read, search, export, /metrics or (SQLite) byte of the database
holds its text, its retried Idempotency-Key replays nothing, the receipt is the tenant's alone, and another tenant's
subject of the same name is untouched. An erasure racing a running turn waits for it, or refuses and removes nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.helpers import add, output
from tests.serving.conftest import BOTH_DATABASES, Server, lines
from tests.serving.test_tenants import ADMIN, notes, tenant_with_key

SECRET, OTHER = "quokkazebra", "wombatfig"
SLOW = ("--tools", "tests.serving.slow_tools:TOOLS")


def call(url: str, key: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(method, url + path, headers={"Authorization": f"Bearer {key}", **kw.pop("headers", {})},
                         timeout=60, **kw)


def _remember(url: str, key: str, marker: str) -> dict[str, str]:
    """Alice's memory under one tenant: what each piece's id is."""
    api = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    chat = dict(model="flowstate", messages=[{"role": "user", "content": f"[n] remember {marker}"}], user="alice")
    api.chat.completions.create(**chat, extra_headers={"Idempotency-Key": "idem-alice-1"})  # type: ignore[arg-type]
    first = api.responses.create(model="flowstate", input=f"[n] {marker} trip", user="alice",
                                 extra_headers={"X-FlowState-Session": "trip"})
    api.responses.create(model="flowstate", input=f"[n] {marker} again", previous_response_id=first.id)
    api.responses.create(model="flowstate", input=f"[n] {marker} other way", previous_response_id=first.id)  # a fork
    conv = api.conversations.create(metadata={"customer": "alice"})
    api.responses.create(model="flowstate", input=f"[n] {marker} in a conversation", conversation=conv.id)
    bg = api.responses.create(model="flowstate", input=f"[n] {marker} later", user="alice", background=True)
    while api.responses.retrieve(bg.id).status in ("queued", "in_progress"):
        time.sleep(0.1)
    return {"response": first.id, "conversation": conv.id, "background": bg.id}


def _text_anywhere(url: str, key: str, marker: str) -> list[str]:
    """Where the API still shows ``marker`` to this key: sessions (each read whole), search, export, /metrics."""
    found = []
    for s in call(url, key, "GET", "/sessions").json()["data"]:
        if marker in call(url, key, "GET", f"/sessions/{s['id']}").text:
            found.append(f"session {s['id']}")
    if call(url, key, "GET", "/memory/search", params={"q": marker}).json()["data"]:
        found.append("search")
    names = [s["id"] for s in call(url, key, "GET", "/sessions").json()["data"]]
    for name in names:
        if marker in call(url, key, "GET", f"/sessions/{name}/export").text:
            found.append(f"export {name}")
    if marker in httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text:
        found.append("metrics")
    return found


@BOTH_DATABASES
def test_an_erased_subject_leaves_no_trace_and_another_tenants_is_untouched(server: Server) -> None:
    url = server.start(notes("[n]", 40), "--admin-key", ADMIN)
    _, _, key = tenant_with_key(url, "acme")
    _, _, other = tenant_with_key(url, "beta")
    ids = _remember(url, key, SECRET)
    _remember(url, other, OTHER)
    assert _text_anywhere(url, key, SECRET)  # the check can fail
    db = Path(str(server.db))
    if db.exists():
        assert SECRET.encode() in b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())

    erased = call(url, key, "POST", "/erasure", json={"subject": "alice"})
    assert erased.status_code == 200, erased.text
    receipt = erased.json()
    assert receipt["object"] == "erasure" and receipt["removed"]["sessions"] == 4  # alice, trip, its fork, the conv
    assert receipt["removed"]["responses"] == 5 and receipt["removed"]["conversations"] == 1
    assert receipt["removed"]["idempotency_keys"] >= 1 and "alice" not in erased.text and SECRET not in erased.text
    assert any("exports" in note for note in receipt["storage"])
    assert _text_anywhere(url, key, SECRET) == [] and call(url, key, "GET", "/sessions").json()["data"] == []
    for rid in (ids["response"], ids["background"]):
        assert call(url, key, "GET", f"/responses/{rid}").status_code == 404
    assert call(url, key, "GET", f"/conversations/{ids['conversation']}").status_code == 404
    again = openai.OpenAI(base_url=url, api_key=key, max_retries=0).chat.completions.create(
        model="flowstate", messages=[{"role": "user", "content": "[n] fresh start"}], user="alice",
        extra_headers={"Idempotency-Key": "idem-alice-1"})  # the old reply was erased with its key: a new turn
    assert SECRET not in again.choices[0].message.content
    assert len(call(url, key, "GET", "/sessions/alice").json()["requests"]) == 1
    assert call(url, key, "GET", f"/erasure/{receipt['id']}").json() == receipt
    assert call(url, other, "GET", f"/erasure/{receipt['id']}").status_code == 404  # another tenant's receipt
    assert len(_text_anywhere(url, other, OTHER)) >= 4  # beta's alice: all there
    if db.exists():
        raw = b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())
        assert SECRET.encode() not in raw and OTHER.encode() in raw
    audit = call(url, ADMIN, "GET", "/admin/audit", params={"action": "subject.erase"}).json()["data"]
    assert [e["target"] for e in audit] == ["sha256:" + receipt["subject_sha256"][:16]]


def test_an_erasure_racing_a_running_turn_waits_for_it_or_refuses_whole(server: Server) -> None:
    slow = lines("[slow]", [output(tools=[{"name": "wait", "arguments": {"seconds": 3}}]),
                            output(delta=[add("kn_waited", said=SECRET)], content=f"done {SECRET}")] * 2)
    url = server.start(slow + notes("[n]", 2), *SLOW)  # "[slow]" first: the later prompts hold "[n]" too
    api = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": f"[n] {SECRET}"}],
                                user="alice")

    def turn() -> None:
        api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[slow] go"}],
                                    user="alice")

    running = threading.Thread(target=turn)
    running.start()
    time.sleep(0.8)
    refused = call(url, "k", "POST", "/erasure", json={"subject": "alice", "wait_s": 0.5})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "subject_busy"
    running.join(60)
    assert len(call(url, "k", "GET", "/sessions/alice").json()["requests"]) == 2  # nothing was removed
    running = threading.Thread(target=turn)
    running.start()
    time.sleep(0.8)
    waited = call(url, "k", "POST", "/erasure", json={"subject": "alice", "wait_s": 30})
    running.join(60)
    assert waited.status_code == 200 and waited.json()["removed"]["requests"] == 3  # the running turn's included
    assert call(url, "k", "GET", "/sessions/alice").status_code == 404
    bad = call(url, "k", "POST", "/erasure", json={"subject": "", "wait_s": 1000})
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request_error"


def test_the_shell_refuses_to_erase_on_a_sqlite_database_a_server_uses(server: Server) -> None:
    """`flowstate erase` beside a running SQLite server would change rows whose sessions the server holds in memory:
    it refuses, names the API, and erases nothing; once the server is stopped (or killed: the lock is the operating
    system's), it erases."""
    import subprocess
    import sys

    url = server.start(lines("[n]", [output(content="noted")]))
    api = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "[n] hi"}], user="alice")
    erase = [sys.executable, "-m", "flowstate.cli", "erase", "alice", "--db", str(server.db)]
    refused = subprocess.run(erase, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "POST /v1/erasure" in refused.stderr and "nothing was erased" in refused.stderr
    assert [s["id"] for s in httpx.get(f"{url}/sessions", timeout=30).json()["data"]] == ["alice"]
    assert server.proc is not None
    server.proc.kill()  # not a clean stop: the lock goes with the process
    server.proc.wait(30)
    done = subprocess.run(erase, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"object": "erasure"' in done.stdout


def test_a_dry_run_says_what_would_go_and_an_admin_erases_for_a_tenant(server: Server) -> None:
    url = server.start(notes("[n]", 40), "--admin-key", ADMIN)
    acme, _, key = tenant_with_key(url, "acme")
    _, _, other = tenant_with_key(url, "beta")
    _remember(url, key, SECRET)
    _remember(url, other, OTHER)
    sessions = sorted(s["id"] for s in call(url, key, "GET", "/sessions").json()["data"])

    preview = call(url, key, "POST", "/erasure", json={"subject": "alice", "dry_run": True})
    assert preview.status_code == 200, preview.text
    seen = preview.json()
    assert seen["object"] == "erasure.preview" and sorted(seen["sessions"]) == sessions and len(sessions) == 4
    assert seen["removed"]["sessions"] == 4 and seen["removed"]["responses"] == 5
    assert sorted(s["id"] for s in call(url, key, "GET", "/sessions").json()["data"]) == sessions  # nothing went
    by_admin = call(url, ADMIN, "POST", f"/admin/tenants/{acme}/erasure", json={"subject": "alice", "dry_run": True})
    assert by_admin.json() == seen

    # an admin erases in the tenant's memory; the receipt is the tenant's, the trail names the admin key
    for bad, status in ((f"/admin/tenants/{acme}/erasure", 403), ("/admin/tenants/t-nobody/erasure", 404)):
        refused = call(url, key if status == 403 else ADMIN, "POST", bad, json={"subject": "alice"})
        assert refused.status_code == status, refused.text
    erased = call(url, ADMIN, "POST", f"/admin/tenants/{acme}/erasure", json={"subject": "alice"})
    assert erased.status_code == 200, erased.text
    receipt = erased.json()
    assert receipt["tenant"] == acme and receipt["removed"] == {**seen["removed"], "vault_values_elsewhere": 0}
    assert call(url, key, "GET", "/sessions").json()["data"] == [] and _text_anywhere(url, key, SECRET) == []
    assert call(url, key, "GET", f"/erasure/{receipt['id']}").json() == receipt
    assert call(url, ADMIN, "GET", f"/erasure/{receipt['id']}", headers={"X-FlowState-Tenant": acme}).json() == receipt
    assert len(_text_anywhere(url, other, OTHER)) >= 4  # another tenant's alice: all there
    trail = call(url, ADMIN, "GET", "/admin/audit", params={"action": "subject.erase"}).json()["data"]
    assert [(e["actor"], e["tenant"], e["detail"].get("dry_run", False)) for e in trail] == [
        ("tenant", acme, True), ("admin", acme, True), ("admin", acme, False)]
    assert "alice" not in str(trail)
