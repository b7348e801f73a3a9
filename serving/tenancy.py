"""Who is calling: one layer in front of every route. ``Authenticated`` (ASGI middleware) resolves the request's
bearer key once — an admin key, or a tenant's key looked up by digest in the database (off the event loop, cached
for ``KEY_CACHE_S``) — and routes ask ``Services.namespace`` / ``Services.admin`` for the outcome, never the key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from flowstate.store.audit import AuditLog, Entry
from flowstate.store.tenants import USE_RESOLUTION_S, Key, TenantError, TenantStore, digest
from serving.errors import APIError

KEY_CACHE_S = 2.0
"""How long a server trusts what it last read of a key: a key revoked (or rotated past its grace) on any server is
refused by every server sharing the database within this bound."""
CACHE_SIZE = 4096  # keys remembered (unknown ones too, so random tokens do not each reach the database)

MISSING = "missing API key: send Authorization: Bearer KEY"
TENANT_HEADER = "x-flowstate-tenant"  # an admin key's request naming the tenant whose memory it reads


def unauthorized(message: str) -> APIError:
    return APIError(401, message, type="authentication_error", code="invalid_api_key")


def forbidden(message: str) -> APIError:
    return APIError(403, message, type="permission_error", code="insufficient_permissions")


@dataclass(frozen=True)
class Caller:
    """What the request's key proved: a tenant (its namespace), the operator (``admin``), or nothing (``error``)."""

    namespace: str | None = None
    admin: bool = False
    error: APIError | None = None
    key: str | None = None  # the key's id as the audit trail names it (never its secret)


class Authenticator:
    """The server's keys: static admin keys, and tenants' keys in the database (static ``--api-key`` keys adopted
    there at start). Open — every caller in the namespace '' — only when no key of either kind exists at start."""

    def __init__(self, store: TenantStore, static_keys: Sequence[str] = (), admin_keys: Sequence[str] = (),
                 audit: AuditLog | None = None) -> None:
        self.store = store
        self.store_audit = audit  # where an admin's reads of a tenant's memory are recorded (None: they are refused)
        self.admin_keys = [k.encode() for k in admin_keys if k]
        for key in static_keys:
            if key:
                store.adopt(key)
        self.open = not self.admin_keys and not store.any_keys()
        self._cache: OrderedDict[str, tuple[float, Key | None]] = OrderedDict()
        self._noted: dict[str, float] = {}  # key id -> when this server last wrote its use (unix seconds)

    async def caller(self, authorization: str | None) -> Caller:
        if self.open:
            return Caller(namespace="")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return Caller(error=unauthorized(MISSING))
        if any(hmac.compare_digest(token.encode(), k) for k in self.admin_keys):
            return Caller(admin=True, key="admin:" + digest(token)[:12])
        key = await self._key(digest(token))
        if key is None or not key.valid(time.time()):
            return Caller(error=unauthorized("invalid API key" if key is None or key.revoked_at is not None
                                             else "expired API key"))
        await self._note(key)
        return Caller(namespace=key.tenant + "/", key=key.id)

    async def _note(self, key: Key) -> None:
        """The key's last use, written at most once a ``USE_RESOLUTION_S`` a key by this server."""
        now = time.time()
        if now - max(key.last_used_at or 0, self._noted.get(key.id, 0)) < USE_RESOLUTION_S:
            return
        if len(self._noted) >= CACHE_SIZE:
            self._noted.clear()
        self._noted[key.id] = now
        await anyio.to_thread.run_sync(self.store.used, key, now)

    async def _key(self, key_digest: str) -> Key | None:
        now = time.monotonic()
        cached = self._cache.get(key_digest)
        if cached is not None and now - cached[0] < KEY_CACHE_S:
            return cached[1]
        key = await anyio.to_thread.run_sync(self.store.lookup, key_digest)
        self._cache[key_digest] = (now, key)
        self._cache.move_to_end(key_digest)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return key

    def forget(self) -> None:
        """Drop what was cached (this server changed a key: it sees the change at once)."""
        self._cache.clear()


ISOLATION = ("off", "tenant", "session")


def cache_salts(mode: str, secret: bytes) -> Callable[[str], str | None]:
    """Each session's prefix-cache partition, as engine calls carry it (``cache_salt``): ``tenant`` — one per tenant
    (the session's namespace; an open server's one namespace is one tenant: no salt), ``session`` — one per session,
    ``off`` — none. A salt is derived here, on the server — an HMAC under ``secret``, never a value a client
    supplies (a caller who could name another's salt would get the side channel back) — and is 43 URL-safe
    characters (vLLM takes 1–128, no ``/``, ``@`` or ``\\``)."""
    if mode not in ISOLATION:
        raise ValueError(f"cache isolation is one of {', '.join(ISOLATION)}, not {mode!r}")

    def salt(session: str) -> str | None:
        namespace = session[:session.rfind("/") + 1]
        what = namespace if mode == "tenant" else session
        if mode == "off" or not what:
            return None
        digest = hmac.new(secret, what.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    return salt


def routing_ids(secret: bytes) -> Callable[[str], str]:
    """The id a session's engine calls are routed by (a router's session header, OpenAI's ``prompt_cache_key``, the
    servers FlowState spreads sessions over): stable for the session under ``secret`` — servers sharing
    ``$FLOWSTATE_CACHE_SECRET`` send the same — and no name a router's log could read (22 URL-safe characters)."""

    def route(session: str) -> str:
        digest = hmac.new(secret, b"route\0" + session.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")

    return route


def entry(caller: Caller, action: str, target: str, tenant: str | None = None, **detail: Any) -> Entry:
    """The audit trail's record of ``caller`` doing ``action`` on ``target`` (the tenant: the caller's own, unless
    an admin acted on one)."""
    own = caller.namespace[:-1] if caller.namespace else None
    return Entry(action, target, "admin" if caller.admin else "tenant", caller.key, tenant or own, detail=detail)


UNKEYED = ("/health", "/ui", "/metrics")  # no key (the console signs in from its page), or a metrics key of its own
READ_AGAIN_S = 60.0
"""An admin key's read of a tenant's path is in the audit trail once a minute at most: the console's page polls
its session every 1.5 s, which would write 2,400 entries an hour of an open tab, each saying the same."""


class Authenticated:
    """ASGI middleware: the request's ``Caller`` in ``scope["state"]["caller"]`` before any route runs."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app, self.auth = app, auth
        self._read: OrderedDict[tuple[str | None, str, str], float] = OrderedDict()  # (key, tenant, path) -> when

    def _read_again(self, key: str | None, tenant: str, path: str) -> bool:
        """Whether this key's read of this tenant's path was recorded within ``READ_AGAIN_S``; if not, it is noted as
        recorded now (so a path polled for an hour is in the trail once a minute)."""
        now, what = time.monotonic(), (key, tenant, path)
        while self._read and now - next(iter(self._read.values())) > READ_AGAIN_S:
            self._read.popitem(last=False)  # oldest first: what is left was recorded within the window
        if what in self._read:
            return True
        self._read[what] = now
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            wanted = (b"authorization", TENANT_HEADER.encode())
            headers = {k: v.decode("latin-1") for k, v in scope["headers"] if k in wanted}
            caller = await self.auth.caller(headers.get(b"authorization"))
            tenant = headers.get(TENANT_HEADER.encode())
            if caller.admin and tenant is not None:
                caller = await self._as_tenant(caller, tenant, scope)
            scope.setdefault("state", {})["caller"] = caller
            error = caller.error
            if error is not None and error.status == 401 and not str(scope["path"]).startswith(UNKEYED):
                # before any route reads its parameters or body: a request without a valid key learns nothing of
                # what the route would have said of them
                response = JSONResponse(error.body(), status_code=401, headers=error.headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _as_tenant(self, caller: Caller, tenant: str, scope: Scope) -> Caller:
        """An admin key reading one tenant's memory: GET only, a tenant that exists, and every such request in the
        audit trail (``session.read``: what it read) before it runs — a path read again within ``READ_AGAIN_S``
        once (a poll)."""
        if scope["method"] != "GET" or self.auth.store_audit is None:
            return Caller(admin=True, key=caller.key, error=forbidden(
                f"an admin key only reads a tenant's memory ({TENANT_HEADER} with GET); it changes none"))
        try:
            await anyio.to_thread.run_sync(self.auth.store.tenant, tenant)
        except TenantError:
            return Caller(admin=True, key=caller.key, error=APIError(
                404, f"no tenant {tenant[:60]!r}", type="not_found_error", param=TENANT_HEADER, code="not_found"))
        reading = Caller(namespace=tenant + "/", admin=True, key=caller.key)
        path = scope["path"] + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        if not self._read_again(caller.key, tenant, path):
            await anyio.to_thread.run_sync(self.auth.store_audit.record, entry(reading, "session.read", path[:500]))
        return reading
