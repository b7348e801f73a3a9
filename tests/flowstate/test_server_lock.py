"""The shell's hold on a SQLite database against servers: refused while a server holds it, and held for the whole of
the shell's work, so no server starts between the check and the change."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from flowstate.store.server_lock import InUse, Serving, unserved


def _shared_now(db: Path) -> bool:
    """Whether a server starting now would get its shared lock at once (it waits otherwise)."""
    with open(f"{db}.serving", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return False
        return True


def test_the_shell_is_refused_beside_a_server_and_holds_servers_off_while_it_works(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    serving = Serving(str(db))
    with pytest.raises(InUse):
        with unserved(str(db)):
            pytest.fail("entered beside a running server")
    serving.release()
    with unserved(str(db)):
        assert not _shared_now(db)  # a server that starts now waits until the shell is done
    assert _shared_now(db)
    with unserved(":memory:"), unserved("postgresql://h/db"):  # nothing to hold
        pass
