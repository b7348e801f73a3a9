"""The SQLite repository: migrations, persistence in one transaction, immutability, errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flowstate import Repository, SessionNotFound, StorageError
from flowstate.migrations import MIGRATIONS
from flowstate.nodes import Node, Ref, Relation, StateType


def state(node_id: str, request: int = 1, refs: tuple[Ref, ...] = ()) -> Node:
    return Node(id=node_id, type=StateType.KNOWLEDGE, summary=node_id, value={"x": node_id}, refs=refs, request=request)


def test_migrations_are_named_and_idempotent(db_path: Path) -> None:
    Repository.open(db_path).close()
    Repository.open(db_path).close()  # second open applies nothing
    conn = sqlite3.connect(db_path)
    assert [r[0] for r in conn.execute("SELECT name FROM schema_migrations")] == [m[0] for m in MIGRATIONS]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_persist_round_trips_nodes_and_relations(repo: Repository) -> None:
    a = state("a")
    b = state("b", refs=(Ref(rel=Relation.DERIVES, state_id="a"),))
    repo.persist_request("s", 1, "first", "answer", [a, b], {"k": 1})
    assert repo.nodes("s") == [a, b]
    assert repo.node("s", "b") == b
    assert repo.incoming("s", "a") == [("b", "derives")]
    assert [(r.index, r.query, r.response) for r in repo.requests("s")] == [(1, "first", "answer")]
    assert repo.request_record("s", 1) == {"k": 1}


def test_persist_is_all_or_nothing(repo: Repository) -> None:
    dangling = state("b", refs=(Ref(rel=Relation.DERIVES, state_id="missing"),))
    with pytest.raises(StorageError, match="cannot persist request 1"):
        repo.persist_request("s", 1, "q", "r", [state("a"), dangling], {})
    assert repo.requests("s") == [] and repo.nodes("s") == [] and not repo.has_session("s")


def test_persist_refuses_an_out_of_order_request(repo: Repository) -> None:
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
def test_the_database_itself_refuses_to_change_history(repo: Repository, db_path: Path, sql: str) -> None:
    repo.persist_request("s", 1, "q", "r", [state("a"), state("b", refs=(Ref(rel=Relation.DERIVES, state_id="a"),))], {})
    conn = sqlite3.connect(db_path)
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        conn.execute(sql)
    conn.close()
    assert [n.summary for n in repo.nodes("s")] == ["a", "b"]


def test_delete_session_forgets_exactly_that_session(repo: Repository) -> None:
    for name in ("s", "t"):
        repo.persist_request(name, 1, "q", "r", [state("a"), state("b", refs=(Ref(rel=Relation.DERIVES, state_id="a"),))], {})
    repo.persist_request("s", 2, "q2", "r2", [state("c", request=2)], {})
    assert repo.delete_session("s") is True
    assert not repo.has_session("s") and repo.nodes("s") == [] and repo.requests("s") == []
    assert [n.id for n in repo.nodes("t")] == ["a", "b"] and repo.incoming("t", "a") == [("b", "derives")]
    assert repo.delete_session("s") is False
    repo.persist_request("s", 1, "fresh", "r", [state("a")], {})  # the name can start over
    assert [r.query for r in repo.requests("s")] == ["fresh"]


def test_sessions_by_prefix(repo: Repository) -> None:
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


def test_unknown_session(repo: Repository) -> None:
    with pytest.raises(SessionNotFound, match="unknown session 'nobody'"):
        repo.require_session("nobody")
