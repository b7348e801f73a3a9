"""Engine faults: each says whether retrying the same call can help."""

from __future__ import annotations


class EngineError(Exception):
    """A model backend failed to produce an output."""

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class EngineConfigError(EngineError):
    """The engine cannot be built or used as configured (bad name, path, option); retrying won't help."""

    retryable = False


class ContextOverflow(EngineConfigError):
    """The prompt does not fit the model's context: the same call fails again, however often it is retried."""


class EngineUnavailable(EngineError):
    """A transient fault (server unreachable, overloaded); the same call may succeed later."""

    retryable = True
