"""A real ``flowstate serve`` (uvicorn) in a subprocess on 127.0.0.1, and scripts for its scripted engine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One server process; ``start`` again after ``stop`` is a restart on the same database."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "serve.db"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.starts = 0

    def start(self, script: Iterable[dict[str, Any]] | None = None, *args: str,
              env: dict[str, str] | None = None) -> str:
        self.starts += 1
        port = free_port()
        cmd = [sys.executable, "-m", "flowstate.cli", "serve", "--port", str(port), "--db", str(self.db),
               "--log-level", "warning", *args]
        if script is not None:
            path = self.tmp / f"script{self.starts}.jsonl"
            path.write_text("".join(json.dumps(line) + "\n" for line in script))
            cmd += ["--engine", "scripted", "--script", str(path)]
        self.log = self.tmp / f"server{self.starts}.log"
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "FLOWSTATE_API_KEYS": "", **(env or {})})
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self.url + "/v1"
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A server on SQLite; ``@BOTH_DATABASES`` runs the test again on a PostgreSQL database of its own."""
    s = Server(tmp_path)
    if getattr(request, "param", "sqlite") == "postgres":
        s.db = request.getfixturevalue("pg_server").new_database()  # type: ignore[assignment]
    yield s
    s.stop()


@pytest.fixture
def two_servers(tmp_path: Path, pg_server: Any) -> Iterator[tuple[Server, Server]]:
    """Two servers (not started) on one fresh PostgreSQL database, stopped and the database dropped after."""
    url = pg_server.new_database()
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        servers.append(Server(tmp_path / name))
        servers[-1].db = url  # type: ignore[assignment]
    yield servers[0], servers[1]
    for s in servers:
        s.stop()
    pg_server.drop(url)


BOTH_DATABASES = pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)


def lines(marker: str, outputs: Sequence[str]) -> list[dict[str, Any]]:
    """Script lines served only to prompts that contain ``marker`` (one marker per session)."""
    return [{"text": text, "when": marker} for text in outputs]
