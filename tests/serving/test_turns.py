"""A turn that dies of a storage fault leaves the session as it was, so the client can retry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.scripted import ScriptedEngine
from flowstate import Repository, StorageError
from flowstate.config import AgentConfig
from flowstate.memory.state import FLOWSTATE
from serving.live import Live
from serving.turns import Turns
from tests.helpers import output


class FailingOnce(Repository):
    failures = 1

    def persist_request(self, *args: Any, **kwargs: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise StorageError("disk full")
        super().persist_request(*args, **kwargs)


def test_a_storage_fault_mid_turn_rolls_the_session_back(tmp_path: Path) -> None:
    repo = FailingOnce.open(tmp_path / "m.db")
    engine = ScriptedEngine([output(content="one"), output(content="two")])
    turns = Turns(engine, repo, AgentConfig(engine, FLOWSTATE))
    live = Live("s", [], 0)
    user = {"role": "user", "content": "hello"}
    with pytest.raises(StorageError, match="disk full"):
        turns.start(live, [user], "", turns.check([]))
    assert (live.transcript, live.settled, live.run) == ([], 0, None) and repo.requests("s") == []
    result = turns.start(live, [user], "", turns.check([]))  # the same message again: no "nothing new", no mix-up
    assert result.message.content == "two" and result.request == 1
    assert live.transcript == [user, {"role": "assistant", "content": "two"}] and live.settled == 2
