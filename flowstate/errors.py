"""FlowState errors, classified by whose fault they are.

Model faults (``ProtocolError``) are recorded and fed back to the model; the loop goes on.
``RequestFailed`` ends one request; what it did is persisted as unfinished (the reason begins with
``records.FAILED``), except where a promise the request made forbids (a contract at the step budget,
``on_budget="fail"``). Storage faults are raised.
Engine faults live in ``engine.errors`` and say whether a retry helps.
"""

from __future__ import annotations

from typing import Any


class FlowStateError(Exception):
    """Base class of FlowState's own errors."""


class ProtocolError(FlowStateError):
    """A model output that breaks the four-block protocol: which block, and what is wrong."""

    def __init__(self, block: str, message: str) -> None:
        super().__init__(f"{block}: {message}")
        self.block = block
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"block": self.block, "message": self.message}


class RequestFailed(FlowStateError):
    """A request could not finish (step budget, repeated protocol errors, engine fault).

    ``record`` holds the steps taken, for inspection.
    """

    def __init__(self, message: str, record: dict[str, Any] | None = None, persisted: bool = False) -> None:
        super().__init__(message)
        self.record = record
        self.persisted = persisted  # the request is stored, unfinished (its reason begins with records.FAILED)


class StorageError(FlowStateError):
    """The repository cannot be opened, read or written."""


class SessionNotFound(StorageError):
    """The named session has no requests in this repository."""


class SessionHasForks(StorageError):
    """The session cannot be forgotten while forks share its requests: they would lose what they share."""

    def __init__(self, session: str, forks: list[str]) -> None:
        shown = ", ".join(repr(f) for f in forks[:5]) + (f" and {len(forks) - 5} more" if len(forks) > 5 else "")
        super().__init__(f"session {session!r} has {len(forks)} fork(s) sharing its requests ({shown}): "
                         "delete them first")
        self.session = session
        self.forks = forks


class ToolLoadError(FlowStateError):
    """A tool set named as ``module:attribute`` cannot be loaded or is not a tool set."""
