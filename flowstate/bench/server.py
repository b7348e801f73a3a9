"""A real ``flowstate serve`` on the scripted engine in a subprocess, for the benches that measure the endpoint."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowstate.protocol import ModelOutput, render_output


def output(**blocks: Any) -> str:
    """One raw model output: the four blocks, empty but for ``blocks``."""
    return render_output(ModelOutput.model_validate({"state_focus": [], "state_delta": [], "tool_calls": [],
                                                     "assistant_message": {"content": None}, **blocks}))


def rss_mb(pid: int) -> float:
    """A process's resident memory, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def serve(tmp: Path, outputs: Sequence[str], db: str, args: Sequence[str] = (),
          source: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """``flowstate serve`` replaying ``outputs`` (any prompt takes the next unused one) on ``db``; ``source``: run
    the server from that source tree instead (a checkout of another commit, for a before/after)."""
    import httpx

    script = tmp / f"script-{time.monotonic_ns()}.jsonl"
    script.write_text("".join(json.dumps({"text": o}) + "\n" for o in outputs))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "flowstate.cli", "serve", "--port", str(port), "--db", db,
                             "--engine", "scripted", "--script", str(script), "--log-level", "warning", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=source)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flowstate serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("flowstate serve did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

