"""How many threads the llamacpp engine runs on: the cores of this process's affinity, less those another
runnable task holds now (llama.cpp's threads wait for each other at every operation, so one that shares a core
stalls them all)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.llamacpp import cores, free_cores


def test_cores_are_the_process_affinity_not_the_machine() -> None:
    assert cores() == len(os.sched_getaffinity(0)) <= (os.cpu_count() or 1)


@pytest.mark.parametrize(("runnable", "total", "free"), [
    ("1/77", 2, 2),  # only the asking thread runs: every core is free
    ("2/77", 2, 1),  # one other task runs: one core left
    ("3/200", 4, 2),
    ("9/77", 2, 1),  # oversubscribed: still one thread
])
def test_free_cores_leave_out_the_cores_other_runnable_tasks_hold(tmp_path: Path, runnable: str, total: int,
                                                                  free: int) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"1.10 0.80 0.50 {runnable} 4242\n")
    assert free_cores(total, str(loadavg)) == free


def test_without_a_load_count_every_core_is_used(tmp_path: Path) -> None:
    assert free_cores(3, str(tmp_path / "absent")) == 3
    (tmp_path / "odd").write_text("garbage")
    assert free_cores(3, str(tmp_path / "odd")) == 3
