"""Crash safety: a real subprocess killed by SIGKILL mid-request loses only the unfinished request (on
both backends: a SQLite file, a PostgreSQL server)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowstate import Repository
from flowstate.store.backends import is_postgres

CHILD = r'''
import sys, time
from pathlib import Path
from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from tests.helpers import add, output

db, marker = sys.argv[1], Path(sys.argv[2])

def wait_here(x: int) -> int:
    """Signal the parent, then hang until killed."""
    marker.write_text("in tool")
    time.sleep(120)
    return x

outputs = []
for k in (1, 2):
    outputs += [output(tools=[{"name": "echo", "arguments": {"x": k}}]),
                output(delta=[add(f"fact_{k}", refs=[("derives", f"obs_r{k}_s1_1")], k=k)], content=f"done {k}")]
outputs += [output(delta=[add("fact_3a"), add("fact_3b")]),
            output(tools=[{"name": "wait_here", "arguments": {"x": 3}}])]

def echo(x: int) -> int:
    """Return x."""
    return x

agent = Agent(ScriptedEngine(outputs), repository=Repository.open(db), session="s", tools=[echo, wait_here])
agent.run("first")
agent.run("second")
agent.run("third, killed in the middle")
'''


@pytest.mark.slow
def test_sigkill_mid_request_keeps_finished_requests_intact(tmp_path: Path, db_target: str) -> None:
    db, marker = db_target, tmp_path / "marker"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, str(script), str(db), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "child exited before reaching the tool"
            assert time.monotonic() < deadline, "child never reached the tool"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()

    if not is_postgres(db):
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        conn.close()
    with Repository.open(db) as repo:
        assert [(r.index, r.query, r.response) for r in repo.requests("s")] == [(1, "first", "done 1"),
                                                                                (2, "second", "done 2")]
        assert [n.id for n in repo.nodes("s")] == ["obs_r1_s1_1", "fact_1", "obs_r2_s1_1", "fact_2"]
        assert repo.node("s", "fact_3a") is None
        # and the session goes on: the next request is request 3
        assert repo.request_count("s") == 2
