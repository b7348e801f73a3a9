"""A real PostgreSQL server for the tests: the one ``$FLOWSTATE_TEST_PG_URL`` names, or a throwaway one
started here (``initdb`` + ``pg_ctl`` on loopback, in a temporary data folder; as root, run as the
``postgres`` user). The two programs are found on PATH or, as Debian and Ubuntu install them, under
``/usr/lib/postgresql/<version>/bin`` (the newest version). Each test gets a database of its own."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

URL_ENV = "FLOWSTATE_TEST_PG_URL"
REQUIRE_ENV = "FLOWSTATE_REQUIRE_PG"  # CI sets it: no server is then a failure, not a skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_program(name: str) -> str | None:
    """``initdb`` or ``pg_ctl``: on PATH, else the newest ``/usr/lib/postgresql/*/bin`` (Debian's server package)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]), reverse=True)
    return versions[0] if versions else None


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0 and shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


class PgServer:
    def __init__(self) -> None:
        self.url = os.environ.get(URL_ENV, "")
        self.data: Path | None = None
        self.pg_ctl = "pg_ctl"
        if not self.url:
            self._start()

    def _start(self) -> None:
        initdb, pg_ctl = server_program("initdb"), server_program("pg_ctl")
        if not (initdb and pg_ctl):
            raise RuntimeError("initdb and pg_ctl are neither on PATH nor under /usr/lib/postgresql/*/bin "
                               "(install PostgreSQL's server package, e.g. Debian's postgresql)")
        self.pg_ctl = pg_ctl
        root = Path(tempfile.mkdtemp(prefix="flowstate-pg-"))
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
        self.data = root / "data"
        port = _free_port()
        run = lambda cmd: subprocess.run(_as_postgres(cmd), check=True, capture_output=True, text=True, timeout=120)  # noqa: E731
        run([initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"])
        run([pg_ctl, "-D", str(self.data), "-l", str(root / "log"), "-w", "-o",
             f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200", "start"])
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self) -> str:
        name = f"flowstate_test_{uuid.uuid4().hex[:12]}"
        self._admin(f"CREATE DATABASE {name}")
        base, _, _ = self.url.rpartition("/")
        return f"{base}/{name}"

    def drop(self, url: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {url.rpartition('/')[2]} WITH (FORCE)")

    def stop(self) -> None:
        if self.data is not None:
            subprocess.run(_as_postgres([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"]),
                           capture_output=True, timeout=60)
            shutil.rmtree(self.data.parent, ignore_errors=True)
