"""Whether a server is using a SQLite database: a running ``flowstate serve`` holds a shared lock on ``<db>.serving``
beside the file (``Serving``); a shell command that must not change what a server holds in memory (``flowstate
erase``) holds it exclusively while it works (``unserved``): refused while any server holds it, and a server that
starts meanwhile waits until the command is done. A lock the operating system
takes, so a server killed without stopping holds nothing. PostgreSQL needs none of this: its servers share the
database's session locks, which the shell takes too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # no advisory locks (Windows): no server is ever seen
    fcntl = None  # type: ignore[assignment]


def _marker(path: str) -> Path | None:
    return None if path == ":memory:" or "://" in path else Path(f"{path}.serving")


class Serving:
    """A server's hold on its SQLite database while it runs (``release`` when it stops)."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] | None = None
        marker = _marker(path)
        if marker is not None and fcntl is not None and marker.parent.is_dir():
            self._file = marker.open("a")
            fcntl.flock(self._file, fcntl.LOCK_SH)

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # the lock goes with the file
            self._file = None


class InUse(Exception):
    """A running server holds the database."""


@contextmanager
def unserved(path: str) -> Iterator[None]:
    """Hold the SQLite database at ``path`` against servers for the block (nothing for PostgreSQL or memory);
    ``InUse`` when a running server holds it. The check and the work are one hold, so no server starts between
    them: one that starts meanwhile waits for the block's end."""
    marker = _marker(path)
    if marker is None or fcntl is None or not marker.parent.is_dir():
        yield
        return
    with marker.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise InUse(path) from None
        yield  # the lock goes with the file
