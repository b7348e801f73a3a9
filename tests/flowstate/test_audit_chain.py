"""The audit trail cannot be rewritten through SQL a server's role can run, on either database, and what the
database owner can still do shows: the hash chain names where (flowstate/store/chain.py, ``flowstate audit
--verify``)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from flowstate.errors import StorageError
from flowstate.store import chain, migrations
from flowstate.store.audit import Entry
from flowstate.store.backends import is_postgres
from flowstate.store.repository import Repository
from tests.pg import PgServer

REWRITES_SQLITE = (
    "INSERT OR REPLACE INTO audit SELECT id, at, tenant, key_id, actor, action, 'forged', result, detail FROM audit",
    "REPLACE INTO audit SELECT id, at, tenant, key_id, actor, action, 'forged', result, detail FROM audit",
    "INSERT OR REPLACE INTO audit_chain SELECT seq, entry, scheme, 'forged' FROM audit_chain",
    "INSERT INTO audit SELECT id, at, tenant, key_id, actor, action, 'forged', result, detail FROM audit WHERE true "
    "ON CONFLICT (id) DO UPDATE SET target = 'forged'",
    "UPDATE audit SET target = 'forged'", "DELETE FROM audit", "UPDATE audit_chain SET digest = 'forged'",
    "DELETE FROM audit_chain")
REWRITES_POSTGRES = (
    "TRUNCATE audit", "TRUNCATE audit_chain", "TRUNCATE audit, audit_chain", "TRUNCATE audit CASCADE",
    "INSERT INTO audit SELECT * FROM audit ON CONFLICT (id) DO UPDATE SET target = 'forged'",
    "INSERT INTO audit_chain SELECT * FROM audit_chain ON CONFLICT (seq) DO UPDATE SET digest = 'forged'",
    "UPDATE audit SET target = 'forged'", "DELETE FROM audit", "UPDATE audit_chain SET digest = 'forged'",
    "DELETE FROM audit_chain")


def _entries(repo: Repository, n: int, tenant: str = "t1") -> list[Entry]:
    return [repo.audit.record(Entry("memory.search", f"sha256:{i:016x}", "tenant", "key_1", tenant)) for i in range(n)]


class Raw:
    """A connection of the database's owner that is not FlowState's: what someone with the file or the URL runs."""

    def __init__(self, target: str) -> None:
        self.postgres = is_postgres(target)
        if self.postgres:
            import psycopg

            self.conn: Any = psycopg.connect(target, autocommit=True)
        else:
            self.conn = sqlite3.connect(target, isolation_level=None)  # recursive_triggers off, as by default

    def run(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(sql.replace("?", "%s") if self.postgres else sql, args)

    def unguard(self) -> None:
        """What only the owner can do: take the triggers away."""
        if self.postgres:
            self.run("ALTER TABLE audit DISABLE TRIGGER USER")
            self.run("ALTER TABLE audit_chain DISABLE TRIGGER USER")
        else:
            for name in ("audit_no_update", "audit_no_delete", "audit_chain_no_update", "audit_chain_no_delete"):
                self.run(f"DROP TRIGGER {name}")

    def close(self) -> None:
        self.conn.close()


def test_sql_that_would_rewrite_or_empty_the_trail_is_refused(db_target: str) -> None:
    repo = Repository.open(db_target)
    written = _entries(repo, 3)
    raw = Raw(db_target)
    try:
        for sql in REWRITES_POSTGRES if raw.postgres else REWRITES_SQLITE:
            with pytest.raises(Exception, match="append-only"):
                raw.run(sql)
        with pytest.raises(StorageError, match="append-only"), repo._write("tamper") as conn:  # FlowState's own too
            conn.execute("INSERT OR REPLACE INTO audit SELECT * FROM audit" if not raw.postgres else "TRUNCATE audit")
    finally:
        raw.close()
    assert repo.audit.entries()[0] == written
    verdict = repo.audit.verify()
    assert verdict.intact and verdict.entries == 3, verdict
    repo.close()


def test_verify_names_each_rewrite_the_owner_can_still_make(db_target: str) -> None:
    repo = Repository.open(db_target)
    written = _entries(repo, 6)
    head = repo.audit.verify().head
    raw = Raw(db_target)
    try:
        raw.unguard()
        raw.run("UPDATE audit SET result = 'refused' WHERE id = ?", (written[1].id,))
        raw.run("DELETE FROM audit WHERE id = ?", (written[3].id,))
        raw.run("INSERT INTO audit (id, at, tenant, key_id, actor, action, target, result, detail) "
                "VALUES ('aud_0', 1.0, 't1', NULL, 'admin', 'tenant.create', 't1', 'ok', '{}')")
        problems = repo.audit.verify().problems
        assert problems == [f"position 2 ({written[1].id}): the entry or the chain before it was changed",
                            "position 4: its entry is gone", "entry aud_0: in no link (added outside FlowState)"]
        raw.run("DELETE FROM audit_chain WHERE seq = 5")
        assert "position 6: follows position 4 (links removed between)" in repo.audit.verify().problems
        # the last entries cut off leave a shorter chain intact: only a head recorded elsewhere shows it
        raw.run("DELETE FROM audit WHERE id <> ?", (written[0].id,))
        raw.run("DELETE FROM audit_chain WHERE seq >= 2")
        cut = repo.audit.verify()
        assert cut.intact and cut.entries == 1
        assert repo.audit.verify(expect=head).problems == [
            f"the recorded head {head} is not in the chain (rewritten, or cut off after it)"]
    finally:
        raw.close()
        repo.close()


def test_a_keyed_chain_cannot_be_chained_again_without_its_key(any_repo: Repository,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(chain.KEY_ENV, "k" * 32)
    written = _entries(any_repo, 4)
    verdict = any_repo.audit.verify()
    assert verdict.intact and verdict.schemes == {chain.scheme("k" * 32): 4}
    assert "k" * 32 not in json.dumps(verdict.__dict__)  # the key's digest names it, never the key
    monkeypatch.setenv(chain.KEY_ENV, "")
    assert any_repo.audit.verify().problems[0].startswith("position 1: keyed (hmac:")  # and "by a key not given"
    _entries(any_repo, 1)  # a writer without the key: an unkeyed link after keyed ones
    monkeypatch.setenv(chain.KEY_ENV, "k" * 32)
    assert any_repo.audit.verify().problems == [
        "position 5: an unkeyed link after keyed ones (written without the key, or forged)"]
    monkeypatch.setenv(chain.KEY_ENV, "z" * 32)
    assert all("another key" in p for p in any_repo.audit.verify().problems[:4])
    monkeypatch.setenv(chain.KEY_ENV, "short")
    with pytest.raises(ValueError, match="at least 16"):
        any_repo.audit.verify()
    with pytest.raises(StorageError, match="at least 16"):  # no action is recorded, or done, under a bad key
        any_repo.audit.record(Entry("memory.search", "x", "tenant"))
    monkeypatch.setenv(chain.KEY_ENV, "k" * 32)
    assert [e.id for e in any_repo.audit.entries()[0]][:4] == [e.id for e in written]


def test_entries_written_before_the_chain_are_chained_by_its_migration(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    db = str(tmp_path / "old.db")
    monkeypatch.setattr(migrations, "MIGRATIONS", [m for m in migrations.MIGRATIONS if m[0] != "0021_audit_chain"])
    Repository.open(db).close()
    raw = sqlite3.connect(db, isolation_level=None)
    for i in range(3):
        raw.execute("INSERT INTO audit VALUES (?, ?, 't1', NULL, 'shell', 'tenant.create', 't1', 'ok', '{}')",
                    (f"aud_{i}", 1.5 + i))
    raw.close()
    monkeypatch.undo()
    repo = Repository.open(db)
    _entries(repo, 2)
    verdict = repo.audit.verify()
    assert verdict.intact and verdict.entries == 5, verdict
    repo.close()


def test_two_servers_appending_at_once_keep_one_dense_chain(pg_server: PgServer) -> None:
    url = pg_server.new_database()
    first, second = Repository.open(url), Repository.open(url)
    try:
        threads = [threading.Thread(target=_entries, args=(r, 25, t)) for r, t in ((first, "a"), (second, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        verdict = first.audit.verify()
        assert verdict.intact and verdict.entries == 50, verdict
    finally:
        first.close()
        second.close()
        pg_server.drop(url)


def _flowstate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "flowstate.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_a_server_role_granted_by_flowstate_grant_reads_and_appends_and_can_rewrite_nothing(
        pg_server: PgServer) -> None:
    import psycopg

    url = pg_server.new_database()
    role = f"app_{url.rpartition('_')[2]}"
    owner = psycopg.connect(url, autocommit=True)
    try:
        owner.execute(f"CREATE ROLE {role} LOGIN")
        Repository.open(url).close()  # the owner makes the tables
        done = _flowstate("grant", role, "--db", url)
        assert done.returncode == 0, done.stderr
        assert f"REVOKE UPDATE, DELETE, TRUNCATE ON \"audit\", \"audit_chain\" FROM \"{role}\"" in done.stdout
        app = url.replace("postgres@", f"{role}@")
        repo = Repository.open(app, create=False)  # a role that owns nothing opens an up-to-date database
        repo.persist_request("t1/s", 1, "q", "r", [], {})
        assert repo.delete_session("t1/s", Entry("session.delete", "s", "tenant", "key_1", "t1"))
        _entries(repo, 2)
        assert repo.audit.verify().entries == 3
        repo.close()
        with psycopg.connect(app, autocommit=True) as conn:
            for sql in ("TRUNCATE audit", "DELETE FROM audit", "UPDATE audit_chain SET digest = ''",
                        "ALTER TABLE audit DISABLE TRIGGER USER", "DROP TRIGGER audit_no_truncate ON audit",
                        "DROP TABLE audit_chain", "SET session_replication_role = replica"):
                with pytest.raises(psycopg.Error, match="permission denied|must be owner"):
                    conn.execute(sql)
        for args, said in ((("grant", "postgres", "--db", url), "superuser"), (("grant", "nobody", "--db", url),
                           "no role 'nobody'"), (("grant", role, "--db", "memory.db"), "a postgresql:// URL")):
            refused = _flowstate(*args)
            assert refused.returncode != 0 and said in refused.stderr, refused.stderr
    finally:
        owner.close()
        pg_server.drop(url)
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_flowstate_audit_verify_prints_the_head_and_fails_on_a_rewrite(tmp_path: Path) -> None:
    db = str(tmp_path / "memory.db")
    repo = Repository.open(db)
    _entries(repo, 3)
    repo.close()
    done = _flowstate("audit", "--verify", "--db", db)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert (found["intact"], found["entries"], found["problems"]) == (True, 3, [])
    assert _flowstate("audit", "--verify", "--expect", found["head"], "--db", db).returncode == 0
    assert _flowstate("audit", "--expect", found["head"], "--db", db).returncode == 2  # --expect needs --verify
    raw = Raw(db)
    raw.unguard()
    raw.run("UPDATE audit SET detail = '{\"forged\": 1}' WHERE rowid = 3")
    raw.close()
    broken = _flowstate("audit", "--verify", "--db", db)
    assert broken.returncode == 1 and "position 3" in json.loads(broken.stdout)["problems"][0]
    short = _flowstate("audit", "--verify", "--db", db, env={chain.KEY_ENV: "short"})
    assert short.returncode == 1 and "at least 16 characters" in short.stderr and "short" not in short.stdout
