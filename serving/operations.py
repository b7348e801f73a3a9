"""The server's own routes: health, its OpenAPI schema, Prometheus metrics, a tenant's usage, the model list."""

from __future__ import annotations

import hmac
import time
from dataclasses import asdict
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from serving.chat.wire import ChatRequest, Ingress
from serving.responses.wire import ResponsesRequest
from serving.services import services_of
from serving.sessions.service import only

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    s = services_of(request)
    return {"status": "ok", "engine": s.config.engine.name, "model": s.config.model_id}


@router.get("/openapi.json")
async def openapi(request: Request) -> dict[str, Any]:
    if not request.state.caller.admin:  # an operator reads the API it manages
        services_of(request).namespace(request)  # like every endpoint but /health, it needs a key
    schema: dict[str, Any] = request.app.openapi()
    return _with_bodies(schema)


_BODIES: dict[str, type[Ingress]] = {"/v1/chat/completions": ChatRequest, "/v1/responses": ResponsesRequest}
"""The request bodies of the routes that read their own (within the ingress limits, as strict as before) and so
declare none to FastAPI: the schema documents them from the same wire models the routes validate with."""


def _with_bodies(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in _BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        schema["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
    return schema


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    """The whole server's figures for a metrics key (or on a server without keys); a client key's own otherwise."""
    s = services_of(request)
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    operator = s.auth.open or request.state.caller.admin or (scheme.lower() == "bearer" and any(
        hmac.compare_digest(token.encode(), k.encode()) for k in s.config.metrics_keys if k))
    body = s.metrics.render(None if operator else s.namespace(request))
    return Response(body, media_type="text/plain; version=0.0.4")


@router.get("/v1/usage")
async def usage(request: Request) -> dict[str, Any]:
    """The caller's tenant's quota and where it stands: this minute's requests, running turns, today's model tokens
    (UTC), each limit null where there is none."""
    s = services_of(request)
    ns = s.namespace(request)
    only(request)  # a parameter it does not take is a 400, as on every other route
    if not ns:
        return {"object": "usage", "tenant": None, "quota": None, "usage": None}
    tenant = ns[:-1]
    quota, now = await anyio.to_thread.run_sync(s.config.repo.quotas.quota, tenant), time.time()
    used = await anyio.to_thread.run_sync(s.config.repo.quotas.usage, tenant)
    return {"object": "usage", "tenant": tenant, "quota": asdict(quota),
            "usage": {"requests_this_minute": used.requests, "running_turns": used.turns, "tokens_today": used.tokens,
                      "minute_resets_in_s": round(used.minute_ends - now, 1),
                      "day_resets_in_s": round(used.day_ends - now, 1)}}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    s = services_of(request)
    s.namespace(request)
    return {"object": "list", "data": [
        {"id": s.config.model_id, "object": "model", "created": 0, "owned_by": "flowstate"}]}
