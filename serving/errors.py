"""API errors: raised anywhere in serving/, turned into OpenAI-shaped error bodies at the edge."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error response: HTTP status and OpenAI's ``{"error": {message, type, param, code}}``."""

    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error",
        param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers
        self.steps: tuple[Any, ...] = ()  # the model calls a failed turn made (counted in /metrics)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def conflict(message: str, code: str) -> APIError:
    return APIError(409, message, type="conflict_error", code=code)
