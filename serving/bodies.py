"""A request's body read within its limits: the size (413) and the time it may take to arrive (408), then parsed as
one JSON object (400 otherwise) — whatever content type the client declared, as OpenAI's API reads it."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.chat.wire import IngressLimits, loads
from serving.errors import APIError, bad_request


async def read_body(request: Request, limits: IngressLimits) -> bytes:
    """The body, within the size limit (413) and the time limit (408)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise APIError(413, f"the body is larger than {limits.max_body_bytes} bytes", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise APIError(413, f"the body is larger than {limits.max_body_bytes} bytes", code="body_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the body did not arrive within {limits.body_timeout_s:.0f} s",
                       code="body_timeout") from None
    return b"".join(chunks)


def json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        data = loads(raw)
    except ValueError as exc:  # not JSON, not UTF-8, NaN, huge integers, deep nesting, lone surrogates
        raise bad_request(f"the body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object", code="invalid_json")
    return data


JSON = b"application/json"
KEPT = (b"application/json", b"multipart/form-data")  # and any +json type: what FastAPI already reads as itself


class JSONBodies:
    """ASGI middleware: a body is JSON whatever content type it declares. ``curl -d '{…}'`` sends
    ``application/x-www-form-urlencoded``, with which FastAPI's typed bodies would answer 422 "Input should be a
    valid dictionary"; no route takes a form, so such a body (or one declared ``text/plain``, or none) is read as
    the JSON it is. A body that is not JSON is then refused as such (400/422 naming the JSON error)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = scope["headers"]
            declared = next((v for k, v in headers if k == b"content-type"), None)
            kind = (declared or b"").split(b";")[0].strip().lower()
            if not (kind.startswith(KEPT) or kind.endswith(b"+json")):
                scope = {**scope, "headers": [(k, v) for k, v in headers if k != b"content-type"]
                         + [(b"content-type", JSON)]}
        await self.app(scope, receive, send)
