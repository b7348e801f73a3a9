"""FlowState errors, classified by whose fault they are.

Model faults (``ProtocolError``) are recorded and fed back to the model; the loop goes on.
``RequestFailed`` ends one request with nothing of it persisted. Storage faults are raised.
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

    Nothing of the request is persisted; ``record`` holds the steps taken, for inspection.
    """

    def __init__(self, message: str, record: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.record = record


class StorageError(FlowStateError):
    """The repository cannot be opened, read or written."""


class SessionNotFound(StorageError):
    """The named session has no requests in this repository."""


class ToolLoadError(FlowStateError):
    """A tool set named as ``module:attribute`` cannot be loaded or is not a tool set."""
