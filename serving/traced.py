"""The HTTP request's span while FlowState traces (flowstate/tracing.py): the parent of the turn it runs, itself the
child of the caller's W3C ``traceparent``. Named by method and route template (``POST /v1/chat/completions``,
``GET /v1/sessions/{session_id}``), never by the path, which holds session names."""

from __future__ import annotations

from typing import Any

from flowstate import tracing


class Traced:
    """ASGI middleware: a span around each HTTP request, the whole response (a stream's too) inside it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not tracing.on():
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        status: dict[str, int] = {}

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        method = scope.get("method", "GET")
        with tracing.span(method, {"http.request.method": method}, parent=tracing.extract(headers)) as span:
            try:
                await self.app(scope, receive, sending)
            finally:
                route = getattr(scope.get("route"), "path", None)
                span.update_name(f"{method} {route}" if route else method)
                span.set_attributes({"http.route": route or "", "http.response.status_code": status.get("code", 0)})
