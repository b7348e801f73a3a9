"""The repository on both backends (SQLite, PostgreSQL): migrations, persistence in one transaction,
immutability enforced by the database, deletion, errors, concurrent writers."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from flowstate import Repository, SessionNotFound, StorageError
from flowstate.inspection import session_dump
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.store.backends import is_postgres
from flowstate.store.migrations import MIGRATIONS, POSTGRES_MIGRATIONS
from flowstate.store.repository import Transcript


def state(node_id: str, request: int = 1, refs: tuple[Ref, ...] = ()) -> Node:
    return Node(id=node_id, type=StateType.KNOWLEDGE, summary=node_id, value={"x": node_id}, refs=refs, request=request)


def raw(target: str, sql: str) -> list[Any]:
    """Run SQL on the database directly, beside the repository."""
    if is_postgres(target):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []
    conn = sqlite3.connect(target)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.commit()
        conn.close()


def test_migrations_are_named_and_idempotent(db_target: str) -> None:
    Repository.open(db_target).close()
    Repository.open(db_target).close()  # second open applies nothing
    names = [r[0] for r in raw(db_target, "SELECT name FROM schema_migrations ORDER BY name")]
    assert names == [m[0] for m in MIGRATIONS] == [m[0] for m in POSTGRES_MIGRATIONS]
    if not is_postgres(db_target):
        assert raw(db_target, "PRAGMA journal_mode")[0][0] == "wal"


def test_servers_starting_together_migrate_once(db_target: str) -> None:
    with ThreadPoolExecutor(4) as pool:
        repos = list(pool.map(lambda _: Repository.open(db_target), range(4)))
    for r in repos:
        r.close()
    assert len(raw(db_target, "SELECT name FROM schema_migrations")) == len(MIGRATIONS)


def test_servers_starting_together_on_a_new_sqlite_file_all_open(tmp_path: Path) -> None:
    """Switching a new file to WAL needs it to itself and SQLite refuses at once while another opener is mid-way
    (its busy timeout does not wait there): 8 openers at once, 60 new files, every one opens (before the retry,
    about one new file in twenty failed)."""
    for i in range(60):
        path = tmp_path / f"m{i}.db"
        with ThreadPoolExecutor(8) as pool:
            repos = list(pool.map(lambda _: Repository.open(path), range(8)))
        for r in repos:
            r.close()
        assert len(raw(str(path), "SELECT name FROM schema_migrations")) == len(MIGRATIONS)


def test_persist_round_trips_nodes_and_relations(any_repo: Repository) -> None:
    repo = any_repo
    a = state("a")
    b = state("b", refs=(Ref(rel=Relation.DERIVES, state_id="a"),))
    repo.persist_request("s", 1, "first", "answer", [a, b], {"k": 1})
    assert repo.nodes("s") == [a, b]
    assert repo.node("s", "b") == b
    assert repo.disclosure("s", "a")[1] == [("b", "derives")]
    assert [(r.index, r.query, r.response) for r in repo.requests("s")] == [(1, "first", "answer")]
    assert repo.records.request("s", 1) == {"k": 1}


def test_persist_is_all_or_nothing(any_repo: Repository) -> None:
    repo = any_repo
    dangling = state("b", refs=(Ref(rel=Relation.DERIVES, state_id="missing"),))
    with pytest.raises(StorageError, match="cannot persist request 1"):
        repo.persist_request("s", 1, "q", "r", [state("a"), dangling], {})
    assert repo.requests("s") == [] and repo.nodes("s") == [] and not repo.has_session("s")


def test_persist_refuses_an_out_of_order_request(any_repo: Repository) -> None:
    repo = any_repo
    repo.persist_request("s", 1, "q", "r", [state("a")], {})
    with pytest.raises(StorageError, match="conflicts with 1 finished"):
        repo.persist_request("s", 1, "q again", "r", [state("b")], {})
    assert [n.id for n in repo.nodes("s")] == ["a"]


@pytest.mark.parametrize("sql", [
    "UPDATE nodes SET summary = 'changed'",
    "DELETE FROM nodes",
    "UPDATE relations SET rel = 'supports'",
    "DELETE FROM relations",
    "UPDATE requests SET query = 'changed'",
    "DELETE FROM requests",
])
def test_the_database_itself_refuses_to_change_history(any_repo: Repository, db_target: str, sql: str) -> None:
    repo = any_repo
    repo.persist_request("s", 1, "q", "r", [state("a"), state("b", refs=(Ref(rel=Relation.DERIVES, state_id="a"),))],
                         {})
    with pytest.raises(Exception, match="immutable"):
        raw(db_target, sql)
    assert [n.summary for n in repo.nodes("s")] == ["a", "b"]
    assert [r.query for r in repo.requests("s")] == ["q"]


def test_delete_session_forgets_exactly_that_session(any_repo: Repository) -> None:
    repo = any_repo
    for name in ("s", "t"):
        repo.persist_request(name, 1, "q", "r",
                             [state("a"), state("b", refs=(Ref(rel=Relation.DERIVES, state_id="a"),))], {})
    repo.persist_request("s", 2, "q2", "r2", [state("c", request=2)], {})
    assert repo.delete_session("s") is True
    assert not repo.has_session("s") and repo.nodes("s") == [] and repo.requests("s") == []
    assert [n.id for n in repo.nodes("t")] == ["a", "b"] and repo.disclosure("t", "a")[1] == [("b", "derives")]
    assert repo.delete_session("s") is False
    repo.persist_request("s", 1, "fresh", "r", [state("a")], {})  # the name can start over
    assert [r.query for r in repo.requests("s")] == ["fresh"]


def test_the_endpoints_transcript_has_a_table_of_its_own(any_repo: Repository) -> None:
    repo = any_repo
    kept = Transcript([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], {"key-1": 1})
    repo.persist_request("s", 1, "hi", "hello", [state("a")], {"steps": []}, transcript=kept)
    repo.persist_request("s", 2, "again", "ok", [], {"steps": []})  # a request that did not come through the endpoint
    assert repo.records.transcripts("s") == {1: kept}
    assert "transcript" not in (repo.records.request("s", 1) or {})  # not a ride in the run record
    with pytest.raises(StorageError):  # written in the request's transaction: a refused request leaves none
        repo.persist_request("s", 2, "dup", "x", [], {}, transcript=kept)
    assert repo.records.transcripts("s") == {1: kept}
    assert repo.delete_session("s") and repo.records.transcripts("s") == {}


def test_nodes_stored_before_marks_are_marked_by_their_prefixes_once(db_target: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from flowstate.store import migrations

    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:6])
    monkeypatch.setattr(migrations, "POSTGRES_MIGRATIONS", POSTGRES_MIGRATIONS[:6])
    Repository.open(db_target).close()  # a database as the release before marks left it
    raw(db_target, "INSERT INTO sessions (name) VALUES ('old')")
    sid = raw(db_target, "SELECT id FROM sessions WHERE name = 'old'")[0][0]
    raw(db_target, f"INSERT INTO requests (session_id, idx, query, record) VALUES ({sid}, 1, 'q', '{{}}')")
    ids = ["mage_s1", "mage_p1", "mem_r1_2", "zipact_r1", "response_r1", "mage_summary_of_x", "obs_r1_s1_1"]
    for n in ids:
        kind = "observation" if n.startswith("obs_") else "state"
        raw(db_target, f"INSERT INTO nodes (session_id, node_id, kind, type, summary, value, request_idx) "
                       f"VALUES ({sid}, '{n}', '{kind}', 'knowledge', 's', '{{}}', 1)")
    monkeypatch.undo()
    with Repository.open(db_target) as repo:  # migration 0007
        marks = {n.id: n.mark for n in repo.nodes("old")}
    assert marks == {"mage_s1": "mage.summary", "mage_p1": "mage.pointer", "mem_r1_2": "mem0.fact",
                     "zipact_r1": "zipact.state", "response_r1": "no-isu.response", "mage_summary_of_x": None,
                     "obs_r1_s1_1": None}
    with pytest.raises(Exception, match="immutable"):  # and history is immutable again afterwards
        raw(db_target, "UPDATE nodes SET mark = 'x'")


def test_sessions_by_prefix(any_repo: Repository) -> None:
    repo = any_repo
    for name in ("k1:a", "k2:a", "k1:b", "k1%"):
        repo.persist_request(name, 1, "q", "r", [], {})
    assert repo.sessions("k1:") == ["k1:a", "k1:b"]
    assert repo.sessions("k1%") == ["k1%"]  # a prefix, not a LIKE pattern
    assert len(repo.sessions()) == 4


def test_open_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no database at"):
        Repository.open(tmp_path / "absent.db", create=False)
    assert not (tmp_path / "absent.db").exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StorageError, match="cannot open database"):
        Repository.open(junk)
    with pytest.raises(StorageError, match="not a regular file"):
        Repository.open(tmp_path)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(StorageError, match="not a FlowState database"):
        Repository.open(other, create=False)


def test_unknown_session(any_repo: Repository) -> None:
    repo = any_repo
    with pytest.raises(SessionNotFound, match="unknown session 'nobody'"):
        session_dump(repo, "nobody")


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
def test_postgres_open_errors_are_clear(pg_server: Any) -> None:
    with pytest.raises(StorageError, match=r"cannot open database postgresql://flowstate:\*\*\*@127.0.0.1:1/x"):
        Repository.open("postgresql://flowstate:secret@127.0.0.1:1/x?connect_timeout=1")
    url = pg_server.new_database()
    try:
        raw(url, "CREATE TABLE t (x int)")
        with pytest.raises(StorageError, match="not a FlowState database"):
            Repository.open(url, create=False)
    finally:
        pg_server.drop(url)


def test_concurrent_writers_of_one_session_never_store_a_request_twice(db_target: str) -> None:
    """Two processes (two repositories) finishing request 1 of one session at once: one wins, one gets a
    clear error, nothing is half stored."""
    a, b = Repository.open(db_target), Repository.open(db_target)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def persist(repo: Repository, node: str) -> None:
        barrier.wait(timeout=30)
        try:
            repo.persist_request("shared", 1, f"from {node}", "r", [state(node)], {})
            outcomes.append("stored")
        except StorageError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=persist, args=(r, n)) for r, n in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes)[-1] == "stored" and outcomes.count("stored") == 1, outcomes
    loser = next(o for o in outcomes if o != "stored")  # a conflict seen first, or the database's own refusal
    assert "request 1" in loser and "'shared'" in loser
    nodes = a.nodes("shared")
    assert len(nodes) == 1 and [r.query for r in a.requests("shared")] == [f"from {nodes[0].id}"]
    a.close()
    b.close()


def test_session_lock_serializes_across_repositories(pg_server: Any) -> None:
    url = pg_server.new_database()
    try:
        a, b = Repository.open(url), Repository.open(url)
        order: list[str] = []
        entered = threading.Event()

        def hold() -> None:
            with a.session_lock("alice"):
                entered.set()
                order.append("a in")
                threading.Event().wait(0.5)
                order.append("a out")

        t = threading.Thread(target=hold)
        t.start()
        entered.wait(5)
        with b.session_lock("bob"):  # another session is not held up
            order.append("bob")
        with b.session_lock("alice"):
            order.append("b in")
        t.join(timeout=60)
        assert order == ["a in", "bob", "a out", "b in"]
        a.close()
        b.close()
    finally:
        pg_server.drop(url)


def test_the_repository_benchmark_measures_both_backends(tmp_path: Path, pg_server: Any) -> None:
    from flowstate.bench.repo import bench_repo, render_table

    made: list[str] = []

    def postgres() -> str:
        made.append(pg_server.new_database())
        return made[-1]

    try:
        rows = bench_repo({"sqlite": lambda: str(tmp_path / f"b{len(made)}.db"), "postgres": postgres}, [200],
                          samples=20)
    finally:
        for url in made:
            pg_server.drop(url)
    assert [(r["backend"], r["nodes"]) for r in rows] == [("sqlite", 200), ("postgres", 200)]
    assert all(r["persist_nodes_per_s"] > 0 and 0 < r["disclose_p50_ms"] <= r["disclose_p99_ms"] for r in rows)
    assert all(r["index_chars"] > 0 for r in rows)
    assert "| 200 | postgres |" in render_table(rows)


def test_stored_responses_by_namespace_and_gone_with_their_session(any_repo: Repository) -> None:
    from flowstate.store.responses import StoredResponse

    body = {"id": "resp_1", "output": [{"type": "message", "content": [{"text": "héllo"}]}]}
    any_repo.responses.save(StoredResponse("resp_1", "ns/", "ns/s", 4, body, [{"id": "msg_1"}]), 1_700_000_000)
    any_repo.responses.save(StoredResponse("resp_2", "ns/", "ns/t", 2, {"id": "resp_2"}, []), 1_700_000_001)
    got = any_repo.responses.get("resp_1", "ns/")
    assert got is not None and (got.session, got.position, got.body,
                                got.input_items) == ("ns/s", 4, body, [{"id": "msg_1"}])
    assert any_repo.responses.get("resp_1", "other/") is None  # another key's response does not exist for it
    with pytest.raises(StorageError):  # ids are unique
        any_repo.responses.save(StoredResponse("resp_1", "ns/", "ns/s", 5, {}, []), 0)
    assert not any_repo.responses.delete("resp_1", "other/") and any_repo.responses.delete("resp_1", "ns/")
    assert any_repo.responses.get("resp_1", "ns/") is None and not any_repo.responses.delete("resp_1", "ns/")
    any_repo.persist_request("ns/t", 1, "q", "a", [], {})
    assert any_repo.delete_session("ns/t") and any_repo.responses.get("resp_2", "ns/") is None


def test_a_fork_shares_its_parents_requests_up_to_its_point_without_copying_them(any_repo: Repository,
                                                                                 db_target: str) -> None:
    repo = any_repo
    repo.persist_request("p", 1, "q1", "r1", [state("a")], {"n": 1},
                         transcript=Transcript([{"role": "user", "content": "q1"}], {"k1": 0}))
    repo.persist_request("p", 2, "q2", "r2", [state("b", 2, (Ref(rel=Relation.DERIVES, state_id="a"),))], {"n": 2})
    repo.persist_request("p", 3, "q3", "r3", [state("c", 3)], {"n": 3})
    copied = raw(db_target, "SELECT COUNT(*) FROM nodes")[0][0]
    repo.lineage.fork("p", 2, "f")
    assert raw(db_target, "SELECT COUNT(*) FROM nodes")[0][0] == copied  # nothing copied
    assert [r.query for r in repo.requests("f")] == ["q1", "q2"] and repo.request_count("f") == 2
    assert [n.id for n in repo.nodes("f")] == ["a", "b"] and repo.node("f", "c") is None
    assert repo.disclosure("f", "a")[1] == [("b", "derives")] and repo.disclosure("f", "b")[0] == repo.node("p", "b")
    assert repo.records.transcripts("f") == repo.records.transcripts("p") and repo.records.request("f", 2) == {"n": 2}
    assert repo.records.request("f", 3) is None
    assert repo.lineage.forked_from("f") == ("p", 2) and repo.lineage.forked_from("p") is None
    # the fork goes on by itself: its own next request is 3, a relation may end at a shared node, the parent is
    # untouched
    repo.persist_request("f", 3, "other q3", "x", [state("c", 3, (Ref(rel=Relation.SUPERSEDES, state_id="b"),))], {})
    assert [(n.id, n.summary) for n in repo.nodes("f")] == [("a", "a"), ("b", "b"), ("c", "c")]
    assert repo.disclosure("f", "b")[1] == [("c", "supersedes")] and repo.disclosure("p", "b")[1] == []
    assert [r.query for r in repo.requests("p")] == ["q1", "q2", "q3"] and repo.node("p", "c") == state("c", 3)
    with pytest.raises(StorageError, match="conflicts with 3 finished"):
        repo.persist_request("f", 3, "again", "x", [], {})
    # a fork of the fork at or before its point shares from the parent itself; after it, from the fork
    repo.lineage.fork("f", 1, "g")
    repo.lineage.fork("f", 3, "h")
    assert repo.lineage.forked_from("g") == ("p", 1) and repo.lineage.forked_from("h") == ("f", 3)
    assert [r.query for r in repo.requests("h")] == ["q1", "q2", "other q3"] and repo.request_count("g") == 1
    repo.lineage.fork("f", 3, "h")  # the same fork again (a retried call): nothing happens
    with pytest.raises(StorageError, match="exists"):
        repo.lineage.fork("f", 2, "h")
    with pytest.raises(StorageError, match="has 3 finished"):
        repo.lineage.fork("p", 4, "i")


def test_a_fork_refuses_a_relation_to_a_node_it_does_not_share(any_repo: Repository) -> None:
    repo = any_repo
    repo.persist_request("p", 1, "q1", "r1", [state("a")], {})
    repo.persist_request("p", 2, "q2", "r2", [state("late", 2)], {})
    repo.lineage.fork("p", 1, "f")
    late = state("b", 2, (Ref(rel=Relation.DERIVES, state_id="late"),))  # the parent's, after the fork's point
    with pytest.raises(StorageError, match="relations end at late"):
        repo.persist_request("f", 2, "q", "r", [late], {})
    assert repo.request_count("f") == 1 and repo.node("f", "b") is None


def test_a_session_with_forks_is_not_forgotten_before_them(any_repo: Repository) -> None:
    from flowstate.errors import SessionHasForks

    repo = any_repo
    repo.persist_request("p", 1, "q1", "r1", [state("a")], {})
    repo.lineage.fork("p", 1, "f")
    with pytest.raises(SessionHasForks, match="'f'"):
        repo.delete_session("p")
    assert [n.id for n in repo.nodes("f")] == ["a"]
    assert repo.delete_session("f") and repo.delete_session("p") and not repo.has_session("p")


def test_an_empty_fork_is_dropped_and_one_that_holds_anything_is_kept(any_repo: Repository) -> None:
    """What a failed first turn leaves (a fork with nothing of its own) goes; a fork with a request, or with a fork
    of its own, stays; the parent is never touched."""
    repo = any_repo
    repo.persist_request("p", 1, "q1", "r1", [state("a")], {})
    repo.lineage.fork("p", 1, "empty")
    repo.lineage.fork("p", 1, "used")
    repo.persist_request("used", 2, "q2", "r2", [], {})
    repo.lineage.fork("p", 1, "parent_of_one")
    repo.lineage.fork("parent_of_one", 1, "child")  # at its own point: shares from p, not from parent_of_one
    repo.lineage.fork("used", 2, "grand")
    assert repo.lineage.drop_empty_fork("empty")
    assert not repo.has_session("empty") and not repo.lineage.drop_empty_fork("empty")
    assert not repo.lineage.drop_empty_fork("used") and repo.request_count("used") == 2
    assert repo.lineage.drop_empty_fork("parent_of_one") and repo.lineage.forked_from("child") == ("p", 1)
    assert [n.id for n in repo.nodes("p")] == ["a"] and repo.request_count("p") == 1
    assert not repo.lineage.drop_empty_fork("absent")
