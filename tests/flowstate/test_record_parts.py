"""A run record's large repeated parts (the tools a request offered, the policy it ran under) are stored once per
session and put back on every read (flowstate/store/parts.py), on both databases: a record reads, exports, imports
and forks as it was written; a small part stays inline; the parts go with their session; a record stored whole
before reads unchanged; a part that is missing is a clear error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flowstate import Repository
from flowstate.errors import StorageError
from flowstate.store import parts

TOOLS = [{"name": f"tool_{i}", "description": "does a thing " * 20, "parameters": {"type": "object"}} for i in range(6)]
POLICY = "You are the airline's agent. " * 40


def record(k: int, **extra: Any) -> dict[str, Any]:
    return {"session": "s", "index": k, "steps": [{"k": k}], "tools": TOOLS, "policy": POLICY, **extra}


def raw(repo: Repository, session: str) -> list[str]:
    with repo._read() as conn:  # what the requests table holds, as stored
        return [r[0] for r in conn.execute("SELECT r.record FROM requests r JOIN sessions s ON s.id = r.session_id"
                                           " WHERE s.name = ? ORDER BY r.idx", (session,))]


def stored_parts(repo: Repository) -> int:
    with repo._read() as conn:
        return int(conn.execute("SELECT COUNT(*) FROM record_parts").fetchone()[0])


def test_parts_are_stored_once_a_session_and_put_back(any_repo: Repository) -> None:
    for k in (1, 2, 3):
        any_repo.persist_request("s", k, f"q{k}", "a", [], record(k))
    assert stored_parts(any_repo) == 2  # the tools and the policy, once for three requests
    rows = raw(any_repo, "s")
    assert all(len(r) < 300 for r in rows), [len(r) for r in rows]  # the whole record is ~5 KB
    assert json.loads(rows[0])["tools"] == {"$part": json.loads(rows[1])["tools"]["$part"]}
    for k in (1, 2, 3):
        assert any_repo.records.request("s", k) == record(k)
    changed = record(4, policy=POLICY + "Refunds need a manager.")  # a new policy: one more part
    any_repo.persist_request("s", 4, "q4", "a", [], changed)
    assert stored_parts(any_repo) == 3 and any_repo.records.request("s", 4) == changed


def test_a_small_part_stays_inline_and_an_older_whole_record_reads_unchanged(any_repo: Repository) -> None:
    small = {"session": "s", "steps": [], "tools": [{"name": "t"}], "policy": "be brief"}
    any_repo.persist_request("s", 1, "q", "a", [], small)
    assert json.loads(raw(any_repo, "s")[0]) == small and stored_parts(any_repo) == 0
    with any_repo._write("an older row") as conn:  # a record written before parts existed: whole, inline
        conn.execute("INSERT INTO requests (session_id, idx, query, response, record, created_at)"
                     " VALUES ((SELECT id FROM sessions WHERE name = 's'), 2, 'q', 'a', ?, 0)",
                     (json.dumps(record(2)),))
    assert any_repo.records.request("s", 2) == record(2)


def test_exported_files_carry_whole_records_and_imports_store_parts_again(any_repo: Repository, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for k in (1, 2):
        any_repo.persist_request("s", k, f"q{k}", "a", [], record(k))
    lines = any_repo.transfer.export(["s"])
    records = [json.loads(line)["record"] for line in lines if json.loads(line).get("kind") == "request"]
    assert records == [record(1), record(2)]
    with Repository.open(tmp_path / "other.db") as other:
        other.transfer.load(lines, rename={"s": "t"})
        assert stored_parts(other) == 2 and all(len(r) < 300 for r in raw(other, "t"))
        assert other.records.request("t", 2) == {**record(2), "session": "t"}


def test_a_fork_reads_its_parents_parts_and_parts_go_with_their_session(any_repo: Repository) -> None:
    for k in (1, 2):
        any_repo.persist_request("s", k, f"q{k}", "a", [], record(k))
    any_repo.lineage.fork("s", 2, "f")
    any_repo.persist_request("f", 3, "q3", "a", [], record(3, session="f"))
    assert any_repo.records.request("f", 1) == record(1)  # shared: the parent's row and the parent's parts
    assert any_repo.records.request("f", 3) == record(3, session="f")
    assert stored_parts(any_repo) == 4  # each session its own parts: none read across sessions
    assert any_repo.delete_session("f") and stored_parts(any_repo) == 2
    assert any_repo.delete_session("s") and stored_parts(any_repo) == 0


def test_a_missing_part_is_a_clear_error(any_repo: Repository) -> None:
    any_repo.persist_request("s", 1, "q", "a", [], record(1))
    with any_repo._write("lose a part") as conn:
        conn.execute("DELETE FROM record_parts WHERE digest IN (SELECT digest FROM record_parts LIMIT 1)")
    with pytest.raises(StorageError, match="names part"):
        any_repo.records.request("s", 1)


def test_the_threshold_counts_bytes(any_repo: Repository) -> None:
    wide = "é" * (parts.MIN_BYTES // 2 + 8)  # under the threshold in characters, over it in UTF-8 bytes
    any_repo.persist_request("s", 1, "q", "a", [], {"steps": [], "policy": wide})
    assert "$part" in raw(any_repo, "s")[0] and any_repo.records.request("s", 1) == {"steps": [], "policy": wide}
