"""A database named wrong is an error, not an empty memory: ``sqlite:///PATH`` is SQLite's URL, any other
``scheme://`` is refused by name (never a new file of that name), a folder that does not exist is refused (never
made), and the shell's tenant commands refuse a database that holds no FlowState memory unless ``--create`` says a
new one is meant — on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowstate import Repository
from flowstate.cli import main
from flowstate.errors import StorageError


@pytest.fixture
def cwd(tmp_path: Path) -> Any:
    before = Path.cwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(before)


def test_sqlites_url_names_the_file(cwd: Path) -> None:
    with Repository.open("sqlite:///relative.db") as repo:
        repo.tenants.create_tenant("acme")
    with Repository.open(f"sqlite:///{cwd / 'absolute.db'}") as repo:  # sqlite:////abs/path: four slashes
        assert repo.tenants.tenants() == []
    assert sorted(p.name for p in cwd.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        "absolute.db", "relative.db"]
    with Repository.open(cwd / "relative.db", create=False) as repo:  # the same file as by its path
        assert [t.name for t in repo.tenants.tenants()] == ["acme"]


@pytest.mark.parametrize(("target", "said"), [
    ("mysql://x@y/z", "not mysql://"),
    ("postgressql://u:secret@h/d", "did you mean postgresql://?"),
    ("sqlite://", "not sqlite://"),
    ("redis://localhost:6379", "not redis://"),
])
def test_another_scheme_is_refused_by_name_and_makes_no_file(cwd: Path, target: str, said: str) -> None:
    with pytest.raises(StorageError, match="SQLite .* or PostgreSQL") as refused:
        Repository.open(target)
    assert said in str(refused.value) and "secret" not in str(refused.value)
    assert list(cwd.iterdir()) == []


def test_a_folder_that_does_not_exist_is_refused_not_made(cwd: Path) -> None:
    with pytest.raises(StorageError, match="the folder nofolder does not exist"):
        Repository.open("nofolder/memory.db")
    assert list(cwd.iterdir()) == []


def test_the_shells_tenant_commands_want_an_existing_memory_or_create(cwd: Path) -> None:
    run = CliRunner().invoke
    for target in ("memroy.db", "sqlite:///memroy.db", "mysql://x@y/z", "postgressql://h/d"):
        listed = run(main, ["tenants", "list", "--db", target])
        assert listed.exit_code == 1 and "error: " in listed.output and "[]" not in listed.output, listed.output
    assert "--create makes a new one" in run(main, ["tenants", "list", "--db", "memroy.db"]).output
    assert list(cwd.iterdir()) == []
    sqlite3.connect(cwd / "other.db").execute("CREATE TABLE t (x)").connection.commit()  # someone else's file
    other = run(main, ["keys", "list", "t1", "--db", "other.db"])
    assert other.exit_code == 1 and "not a FlowState database" in other.output
    made = run(main, ["tenants", "create", "acme", "--db", "sqlite:///memory.db", "--create"])
    assert made.exit_code == 0, made.output
    listed = run(main, ["tenants", "list", "--db", "memory.db"])
    assert listed.exit_code == 0 and '"name": "acme"' in listed.output


def test_a_postgres_database_without_flowstates_tables_is_said_so(pg_server: Any) -> None:
    url = pg_server.new_database()
    try:
        run = CliRunner().invoke
        listed = run(main, ["tenants", "list", "--db", url])
        assert listed.exit_code == 1 and "not a FlowState database" in listed.output, listed.output
        assert run(main, ["tenants", "create", "acme", "--db", url, "--create"]).exit_code == 0
        assert '"name": "acme"' in run(main, ["tenants", "list", "--db", url]).output
    finally:
        pg_server.drop(url)
