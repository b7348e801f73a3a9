"""The test run itself: a real model's tests run on one worker, one at a time, every test has a time limit that
fits what it runs, and a test that hangs fails with its traceback while the run goes on."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ONE_AT_A_TIME, TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

# model modules and quick ones
MODULES = ["tests/engine/test_errors.py", "tests/flowstate/test_demo_embedded.py",
           "tests/engine/test_llamacpp_threads.py", "tests/flowstate/test_rules.py", "tests/flowstate/test_parse.py",
           "tests/flowstate/test_limits.py"]


def test_a_real_models_tests_run_on_one_worker_and_every_test_has_its_limit(tmp_path: Path) -> None:
    """The schedule of a real two-worker run (``-n 2``, as ``pytest`` runs), each test recorded by
    the worker that got it and skipped before its fixtures (tests/schedule_probe.py)."""
    log = tmp_path / "schedule.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", *MODULES, "-p", "tests.schedule_probe", "-n", "2",
                           "-p", "no:cacheprovider", "-q"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "FLOWSTATE_SCHEDULE_LOG": str(log)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    model = [e for e in entries if Path(e["path"]).relative_to(ROOT).as_posix() in ONE_AT_A_TIME]
    rest = [e for e in entries if e not in model]
    assert len({Path(e["path"]).name for e in model}) == 3 and len(rest) > 10, entries
    assert len({e["worker"] for e in model}) == 1, sorted((e["worker"], e["test"]) for e in model)
    assert {e["worker"] for e in entries} == {"gw0", "gw1"}  # the rest spread over both
    ran = [e for e in entries if e["worker"] == model[0]["worker"]]  # in order: one unit, so a module's fixtures
    first = ran.index(model[0])                                      # are set up once
    assert ran[first:first + len(model)] == model
    assert {e["timeout"] for e in model} == {TIMEOUT_S["model"]}
    slow = {e["timeout"] for e in rest if Path(e["path"]).name == "test_rules.py"}
    assert slow <= {TIMEOUT_S["fast"], TIMEOUT_S["slow"]} and TIMEOUT_S["fast"] in slow


HANGS = '''
import pathlib
import subprocess
import sys
import threading

import pytest


@pytest.mark.timeout(3)
def test_waits_for_ever():
    threading.Event().wait()


@pytest.mark.timeout(3)
def test_a_child_that_never_ends():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(3600)"])


def test_after_them():
    pathlib.Path("ran_after").write_text("yes")  # the run went on past the two that hung
    assert pathlib.Path("ran_after").read_text() == "yes"
'''


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_test_that_hangs_fails_with_its_traceback_and_the_run_goes_on(tmp_path: Path, workers: str) -> None:
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent(HANGS))
    done = subprocess.run([sys.executable, "-m", "pytest", "test_hangs.py", "-n", workers, "-p", "no:cacheprovider",
                           "-c", os.devnull, "--rootdir", str(tmp_path), "-o", "timeout_method=signal"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "2 failed, 1 passed" in out and (tmp_path / "ran_after").read_text() == "yes", out[-3000:]
    for test in ("test_waits_for_ever", "test_a_child_that_never_ends"):
        assert f"FAILED test_hangs.py::{test} - Failed: Timeout" in out, out[-3000:]
    assert "threading.Event().wait()" in out and "time.sleep(3600)" in out, out[-3000:]  # where each hung


def unbounded_waits(path: Path) -> list[str]:
    """The calls in ``path`` that could wait for ever: a subprocess run without ``timeout=``, or a ``wait()`` /
    ``communicate()`` / ``join()`` given no time limit."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, keywords = node.func.attr, {k.arg for k in node.keywords}
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        runs = owner == "subprocess" and name in {"run", "call", "check_call", "check_output"}
        waits = name in {"wait", "communicate", "join"} and not node.args and "timeout" not in keywords \
            and not (isinstance(node.func.value, ast.Constant))  # "".join(...) takes an argument anyway
        if runs and "timeout" not in keywords or waits:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_every_subprocess_and_wait_in_the_tests_has_a_time_limit() -> None:
    found = [hit for path in sorted((ROOT / "tests").rglob("*.py")) for hit in unbounded_waits(path)]
    assert not found, "\n".join(found)
