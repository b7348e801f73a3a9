"""Retention at the store: policies parsed and shown, what is due at a clock the test sets, a sweep that removes it
all (forks first, never a held, waiting or revived session), per-tenant policies, two repositories sweeping one
PostgreSQL, and a dry run that lists exactly what the sweep then removes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowstate import Repository
from flowstate.store.repository import Transcript
from flowstate.store.responses import StoredResponse
from flowstate.store.retention import DAY_S, Expired, PolicyError, RetentionPolicy, duration, parse_policy
from tests.flowstate.test_repository import raw, state

NOW = 1_800_000_000
POLICY = RetentionPolicy(idle_s=30 * DAY_S, age_s=180 * DAY_S)


def test_policies_parse_and_show() -> None:
    assert parse_policy("idle=30d,age=180d") == POLICY
    assert str(POLICY) == "idle=30d,age=180d" and str(parse_policy("age=2w")) == "age=14d"
    assert parse_policy("off") == RetentionPolicy() and not RetentionPolicy() and str(RetentionPolicy()) == "off"
    assert duration("90m") == 5400 and duration(" 45s ") == 45
    for bad in ("idle=30", "idle=0d", "keep=3d", "idle=1d,idle=2d", "idle=-1d", "30d"):
        with pytest.raises(PolicyError):
            parse_policy(bad)


def _session(repo: Repository, target: str, name: str, created: int, active: int | None = None) -> None:
    """A session of one request (a state, a transcript with an Idempotency-Key) made and last active when the
    test says."""
    k = repo.request_count(name) + 1
    repo.persist_request(name, k, "q", "r", [state(f"a{k}", request=k)], {},
                         transcript=Transcript([{"role": "user", "content": "q"}], {"idem-" + name: 0}))
    _clock(target, name, created, active)


def _clock(target: str, name: str, created: int, active: int | None = None) -> None:
    raw(target, f"UPDATE sessions SET created_at = {created}, active_at = {active or created} WHERE name = '{name}'")


def _response(repo: Repository, rid: str, session: str, created: int, namespace: str = "",
              lease: int | None = None) -> None:
    repo.responses.save(StoredResponse(rid, namespace, session, 0, {"id": rid}, []), created, lease)


def test_what_is_due_and_the_sweep_removes_it_all(any_repo: Repository, db_target: str) -> None:
    repo, t = any_repo, db_target
    old, idle = NOW - 200 * DAY_S, NOW - 40 * DAY_S
    _session(repo, t, "aged", old, NOW - DAY_S)  # active yesterday, but made 200 days ago: past age
    _session(repo, t, "idle", NOW - 50 * DAY_S, idle)  # idle 40 days: past idle
    _session(repo, t, "fresh", NOW - 50 * DAY_S, NOW - DAY_S)
    _session(repo, t, "parent", NOW - 60 * DAY_S, idle)
    repo.lineage.fork("parent", 1, "child")
    _clock(t, "child", NOW - 45 * DAY_S, idle)  # both expired: the fork goes first, then its parent
    _session(repo, t, "shared", NOW - 60 * DAY_S, idle)
    repo.lineage.fork("shared", 1, "living")
    _clock(t, "living", NOW - 2 * DAY_S)  # its fork is alive: the parent stays
    _session(repo, t, "waits", NOW - 60 * DAY_S, idle)
    repo.waiting.save("waits", 2, {"calls": []})  # a request waits on tool results: kept
    _response(repo, "resp_old", "fresh", NOW - 31 * DAY_S)
    _response(repo, "resp_new", "fresh", NOW - DAY_S)
    _response(repo, "resp_running", "fresh", NOW - 31 * DAY_S, lease=NOW)
    repo.conversations.save("conv_unused", {}, NOW - 31 * DAY_S)
    repo.conversations.save("fresh", {"topic": "kept with its session"}, NOW - 31 * DAY_S)

    due = repo.retention.due(POLICY, NOW)
    assert [(e.kind, e.name) for e in due] == [
        ("session", "child"), ("session", "idle"), ("session", "aged"), ("response", "resp_old"),
        ("conversation", "conv_unused")]  # a parent with a fork, a waiting session: not yet due
    why = {e.name: e.why for e in due}  # which policy, and the time past it
    def when(t: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    assert why["idle"] == f"the server's policy idle=30d,age=180d: idle 40d (last active {when(idle)}) > idle=30d"
    assert why["aged"] == f"the server's policy idle=30d,age=180d: 200d old (created {when(old)}) > age=180d"
    assert why["resp_old"].endswith(f"31d old (created {when(NOW - 31 * DAY_S)}) > 180d")
    _response(repo, "resp_of_idle", "idle", NOW - DAY_S)  # goes with its session
    assert {e.name: e.responses for e in repo.retention.due(POLICY, NOW) if e.kind == "session"}["idle"] == 1
    before = repo.sessions()
    planned = repo.retention.sweep(POLICY, NOW, batch=2, dry_run=True)  # the sweep, rolled back
    assert repo.sessions() == before and repo.audit.entries()[0] == [] and repo.responses.get("resp_old", "")
    removed = repo.retention.sweep(POLICY, NOW, batch=2)
    assert removed == planned  # the dry run listed exactly what went, the parent after its fork included
    assert {e.name for e in removed} == {e.name for e in due} | {"parent"}
    assert repo.sessions() == ["fresh", "shared", "living", "waits"]
    assert repo.responses.get("resp_new",
                              "") and repo.responses.get("resp_running", "") and not repo.responses.get("resp_old", "")
    assert repo.conversations.get("fresh") and not repo.conversations.get("conv_unused")
    for table in ("requests", "nodes", "transcripts", "relations"):  # nothing of the removed sessions is left
        names = {r[0] for r in raw(db_target, f"SELECT DISTINCT s.name FROM {table} t JOIN sessions s"
                                              " ON s.id = t.session_id")}
        assert names <= {"fresh", "shared", "waits"}, table
    entries, _ = repo.audit.entries(action="session.expire")
    assert sorted(e.target for e in entries) == ["aged", "child", "idle", "parent"]
    assert {e.actor for e in entries} == {"shell"} and entries[0].detail == {"policy": "idle=30d,age=180d"}
    assert repo.retention.due(POLICY, NOW) == []  # nothing is removed twice


def test_a_session_that_came_back_to_life_is_kept(repo: Repository, db_path: Path) -> None:
    _session(repo, str(db_path), "s", NOW - 40 * DAY_S)
    due = repo.retention.due(POLICY, NOW)
    _clock(str(db_path), "s", NOW - 40 * DAY_S, NOW)  # a turn finished between the list and the removal
    assert repo.retention.expire(due, POLICY, NOW) == [] and repo.sessions() == ["s"]


def test_tenants_policies_replace_the_servers(repo: Repository, db_path: Path) -> None:
    short = repo.tenants.create_tenant("short").id
    never = repo.tenants.create_tenant("never").id
    assert repo.retention.set_policy(short, parse_policy("idle=7d"))
    assert repo.retention.set_policy(never, RetentionPolicy()) and repo.retention.policy(never) == RetentionPolicy()
    assert not repo.retention.set_policy("nobody", RetentionPolicy())
    for ns in (f"{short}/", f"{never}/", ""):
        _session(repo, str(db_path), ns + "ten_days", NOW - 10 * DAY_S)
        _session(repo, str(db_path), ns + "forty_days", NOW - 40 * DAY_S)
    removed = {e.name for e in repo.retention.sweep(POLICY, NOW)}
    assert removed == {f"{short}/ten_days", f"{short}/forty_days", "forty_days"}
    assert {(e.name, e.tenant) for e in repo.retention.sweep(POLICY, NOW + 31 * DAY_S)} == {("ten_days", None)}
    assert repo.retention.set_policy(short, None) and repo.retention.policy(short) is None


def test_no_policy_removes_nothing(repo: Repository, db_path: Path) -> None:
    _session(repo, str(db_path), "ancient", 1000)
    assert repo.retention.due(RetentionPolicy(), NOW) == [] and repo.retention.sweep(RetentionPolicy(), NOW) == []
    assert repo.sessions() == ["ancient"]


def test_two_repositories_sweeping_one_postgres_remove_each_row_once(pg_server: object) -> None:
    url = pg_server.new_database()  # type: ignore[attr-defined]
    try:
        a, b = Repository.open(url), Repository.open(url)
        for i in range(40):
            _session(a, url, f"s{i}", NOW - 40 * DAY_S)
        with a.session_lock("s7"):  # a turn of another server holds s7: neither sweep touches it
            start = threading.Barrier(2)

            def sweep(repo: Repository) -> list[Expired]:
                start.wait(5)
                return repo.retention.sweep(POLICY, NOW, batch=3)

            with ThreadPoolExecutor(2) as pool:
                got = list(pool.map(sweep, (a, b)))
        names = [e.name for found in got for e in found]
        assert sorted(names) == sorted(f"s{i}" for i in range(40) if i != 7)  # each once, the held one kept
        assert a.sessions() == ["s7"] and len(a.audit.entries(action="session.expire", limit=100)[0]) == 39
        with a.retention.try_sweeping() as first, b.retention.try_sweeping() as second:
            assert (first, second) == (True, False)  # one server at a time
        a.close()
        b.close()
    finally:
        pg_server.drop(url)  # type: ignore[attr-defined]


def test_the_shell_sets_a_tenants_policy(db_path: Path) -> None:
    from click.testing import CliRunner

    from flowstate.cli import main

    with Repository.open(db_path) as repo:
        tenant = repo.tenants.create_tenant("acme").id
    run = CliRunner().invoke
    got = run(main, ["tenants", "retention", tenant, "idle=2w", "--db", str(db_path)])
    assert got.exit_code == 0 and '"retention": "idle=14d"' in got.output
    assert run(main, ["tenants", "retention", tenant, "idle=2", "--db", str(db_path)]).exit_code == 2
    assert run(main, ["tenants", "retention", "nobody", "off", "--db", str(db_path)]).exit_code == 1
    assert run(main, ["tenants", "retention", tenant, "default", "--db", str(db_path)]).exit_code == 0
    with Repository.open(db_path) as repo:
        assert repo.retention.policy(tenant) is None
        assert [e.detail for e in repo.audit.entries(action="tenant.retention")[0]] == [{"retention": "idle=2w"},
                                                                                         {"retention": "default"}]
