"""Retention on real servers: a session whose stored times the test moves past the policy disappears on its own,
with its responses and everything it owns, counted in /metrics and the audit trail, while a session whose turn runs
through the sweeps is untouched; a tenant's own policy replaces the server's; two servers sweeping one PostgreSQL
remove each session once; ``flowstate retention --dry-run`` lists what the sweep then removes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.flowstate.test_repository import raw
from tests.helpers import add, output
from tests.serving.conftest import BOTH_DATABASES, Server, lines
from tests.serving.test_tenants import ADMIN, admin, notes

DAY = 86_400
SLOW = ("--tools", "tests.serving.slow_tools:TOOLS")
SWEEPING = ("--retention", "idle=30d", "--retention-every", "1")


def age(db: Any, name: str, days: int) -> None:
    """Move a stored session's clock ``days`` back (what the sweep reads: when it was made and last active)."""
    then = int(time.time()) - days * DAY
    raw(str(db), f"UPDATE sessions SET created_at = {then}, active_at = {then} WHERE name = '{name}'")


def gone(url: str, name: str, key: str = "k", within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = httpx.get(f"{url}/sessions/{name}", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        if got.status_code == 404:
            return True
        time.sleep(0.2)
    return False


def chat(url: str, session: str, text: str, key: str = "k") -> Any:
    api = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    return api.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": text}], user=session)


def removed(url: str) -> dict[str, float]:
    body = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            if line.startswith("flowstate_retention_removed_total{")}


@BOTH_DATABASES
def test_expired_memory_disappears_on_its_own_and_a_running_turn_is_never_touched(server: Server) -> None:
    slow = lines("[slow]", [output(tools=[{"name": "wait", "arguments": {"seconds": 4}}]),
                            output(delta=[add("kn_waited", waited=True)], content="done waiting")])
    url = server.start(notes("[n]", 3) + slow, *SWEEPING, *SLOW, "--log-level", "info")
    chat(url, "old", "[n] remember")
    chat(url, "busy", "[n] remember")
    api = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    stored = api.responses.create(model="flowstate", input="[n] a response", user="old")
    age(server.db, "old", 40)
    assert gone(url, "old")  # the sweep removed it, its stored response with it
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(stored.id)
    running: dict[str, Any] = {}
    turn = threading.Thread(target=lambda: running.update(out=chat(url, "busy", "[slow] take your time")))
    turn.start()
    time.sleep(1.0)
    age(server.db, "busy", 40)  # expired while its turn runs: at least two sweeps pass it by
    turn.join(60)
    assert running["out"].choices[0].message.content == "done waiting"  # the turn persisted into its session
    assert len(httpx.get(f"{url}/sessions/busy", timeout=30).json()["requests"]) == 2
    time.sleep(2.5)  # its turn made it active again: not expired any more
    assert httpx.get(f"{url}/sessions/busy", timeout=30).status_code == 200
    assert removed(url).get("session") == 1.0 and removed(url).get("response", 0.0) == 0.0
    entries = [r for r in raw(str(server.db), "SELECT action, target, actor FROM audit") if r[0] == "session.expire"]
    assert entries == [("session.expire", "old", "server")]
    assert "INFO:     flowstate.serving: retention removed 1 session(s)\n" in server.log.read_text()  # as documented


def test_a_tenants_own_policy_replaces_the_servers(server: Server) -> None:
    url = server.start(notes("[t]", 4), *SWEEPING, "--admin-key", ADMIN)
    made = admin(url, "POST", "/tenants", name="brief", retention="idle=7d")
    assert made.status_code == 201 and made.json()["retention"] == "idle=7d"
    kept = admin(url, "POST", "/tenants", name="keeper", retention="off").json()
    bad = admin(url, "PATCH", f"/tenants/{kept['id']}", retention="idle=forever")
    assert bad.status_code == 422 and "invalid duration" in bad.text
    brief_key = admin(url, "POST", f"/tenants/{made.json()['id']}/keys").json()["secret"]
    keeper_key = admin(url, "POST", f"/tenants/{kept['id']}/keys").json()["secret"]
    chat(url, "ten", "[t] one", brief_key)
    chat(url, "ten", "[t] two", keeper_key)
    age(server.db, f"{made.json()['id']}/ten", 10)
    age(server.db, f"{kept['id']}/ten", 400)
    assert gone(url, "ten", brief_key)  # 10 days idle: past the tenant's 7
    assert httpx.get(f"{url}/sessions/ten", headers={"Authorization": f"Bearer {keeper_key}"},
                     timeout=30).status_code == 200  # off: kept however old
    back = admin(url, "PATCH", f"/tenants/{kept['id']}", retention=None)  # the server's 30 days again
    assert (back.status_code == 200 and back.json()["retention"] is None
            and back.json()["quota"]["concurrent_turns"] is None)
    assert gone(url, "ten", keeper_key)
    audit = admin(url, "GET", "/audit?action=tenant.retention").json()["data"]
    assert [e["detail"] for e in audit] == [{"retention": None}]


def test_two_servers_sweeping_one_postgres_remove_each_session_once(two_servers: tuple[Server, Server]) -> None:
    a, b = two_servers
    url_a = a.start(notes("[p]", 24), *SWEEPING)
    for i in range(24):
        chat(url_a, f"s{i}", "[p] remember")
    url_b = b.start(notes("[q]", 1), *SWEEPING)
    raw(str(a.db), f"UPDATE sessions SET created_at = {int(time.time()) - 40 * DAY}, active_at = 0")
    assert all(gone(url_b, f"s{i}") for i in range(24))
    expired = [r[0] for r in raw(str(a.db), "SELECT target FROM audit WHERE action = 'session.expire'")]
    assert sorted(expired) == sorted(f"s{i}" for i in range(24))  # each once, whichever server removed it
    assert removed(url_a).get("session", 0.0) + removed(url_b).get("session", 0.0) == 24


def test_the_dry_run_lists_what_the_sweep_then_removes(server: Server) -> None:
    url = server.start(notes("[d]", 3))
    for name in ("a", "b", "c"):
        chat(url, name, "[d] remember")
    server.stop()
    age(server.db, "a", 40)
    age(server.db, "c", 200)

    def retention(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flowstate.cli", "retention", "--db", str(server.db),
                               "--policy", "idle=30d", *args], capture_output=True, text=True, timeout=120)

    dry = retention("--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove: 2 session(s), 0 response(s), 0 conversation(s)" in dry.stderr
    done = retention()
    assert done.returncode == 0 and done.stdout == dry.stdout and '"name": "c"' in done.stdout
    assert sorted(r[0] for r in raw(str(server.db), "SELECT name FROM sessions")) == ["b"]
    bad = subprocess.run([sys.executable, "-m", "flowstate.cli", "retention", "--db", str(server.db), "--policy",
                          "idle=30"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid duration" in bad.stderr
