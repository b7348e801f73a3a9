"""A pytest plugin that shows the test schedule itself: with ``-p tests.schedule_probe`` every test is written to the
JSON Lines file ``$FLOWSTATE_SCHEDULE_LOG`` — its id, the xdist worker that got it and its time limit — and skipped
before any fixture runs, so a suite's schedule is seen in seconds without running a model."""

from __future__ import annotations

import json
import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    limit = item.get_closest_marker("timeout")
    entry = {"test": item.nodeid, "path": item.path.as_posix(), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
             "timeout": limit.args[0] if limit is not None and limit.args else None}
    with open(os.environ["FLOWSTATE_SCHEDULE_LOG"], "a", encoding="utf-8") as f:  # one short line: an atomic append
        f.write(json.dumps(entry) + "\n")
    pytest.skip("schedule probe: recorded, not run")
