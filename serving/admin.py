"""``/v1/admin/...``: tenants and their keys, managed while the server runs, by an admin key only. A key's secret is
in the one response that makes it (a new key, a rotation) and nowhere else: the database keeps its digest."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flowstate.store.audit import ACTIONS, ACTORS, MAX_PAGE, Entry
from flowstate.store.quotas import Quota
from flowstate.store.repository import Repository
from flowstate.store.retention import PolicyError, RetentionPolicy, parse_policy
from flowstate.store.tenants import Key, Tenant, TenantError, TenantStore
from serving.erasure import ErasureIn, erase_subject
from serving.errors import APIError, bad_request, conflict
from serving.naming import MAX_NAME, check_name
from serving.services import Services
from serving.tenancy import entry


def _admin(request: Request) -> None:
    """Before anything else of an admin route (its body included): an admin key, or 401 / 403."""
    s: Services = request.app.state.services
    s.admin(request)


router = APIRouter(prefix="/v1/admin", dependencies=[Depends(_admin)])
DAY = 86_400
MAX_GRACE_S = 30 * DAY  # how long a rotated key may go on working
DEFAULT_GRACE_S = 3600
MAX_LIFETIME_S = 10 * 365 * DAY


class QuotaIn(BaseModel):
    """A tenant's limits; a limit left out (or null) is none — on a PATCH, a limit left out stays as it was."""

    model_config = ConfigDict(extra="forbid", strict=True)  # a limit of true is not 1
    requests_per_minute: int | None = Field(default=None, ge=1, le=1_000_000)
    concurrent_turns: int | None = Field(default=None, ge=1, le=100_000)
    tokens_per_day: int | None = Field(default=None, ge=1, le=10**13)

    def quota(self) -> Quota:
        return Quota(self.requests_per_minute, self.concurrent_turns, self.tokens_per_day)


def _policy(text: str | None) -> str | None:
    """A retention policy as given (``idle=30d,age=180d``, ``off``), checked; None: the server's."""
    if text is not None:
        try:
            parse_policy(text)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
    return text


RETENTION = Field(default=None, max_length=100, description="how long the tenant's memory is kept: idle=30d,age=180d "
                  "(either bound alone) or off; null: the server's --retention")


class NewTenant(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=MAX_NAME)
    quota: QuotaIn = Field(default_factory=lambda: QuotaIn())
    retention: str | None = RETENTION

    _check = field_validator("retention")(_policy)


class TenantChange(BaseModel):
    """What changes: the limits, the retention policy, or both (a field left out stays as it is; a null
    ``retention`` goes back to the server's)."""

    model_config = ConfigDict(extra="forbid")
    quota: QuotaIn | None = None
    retention: str | None = RETENTION

    _check = field_validator("retention")(_policy)


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    expires_in: int | None = Field(default=None, ge=60, le=MAX_LIFETIME_S,
                                   description="seconds the key works; none: until revoked")


class Rotation(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    grace_s: int = Field(DEFAULT_GRACE_S, ge=0, le=MAX_GRACE_S, description="seconds the old key goes on working")


class UsageObject(BaseModel):
    """Where a tenant stands against its quota now (counted only while it has a limit of some kind)."""

    requests_this_minute: int
    running_turns: int
    tokens_today: int = Field(description="model tokens since 00:00 UTC")


class TenantObject(BaseModel):
    id: str
    object: Literal["tenant"] = "tenant"
    name: str
    created_at: int
    quota: QuotaIn
    retention: str | None = Field(None, description="the tenant's own retention policy; null: the server's")
    usage: UsageObject | None = Field(default=None, description="in the list of tenants: its usage now")
    sessions: int | None = Field(default=None, description="in the list of tenants: how many sessions it has")
    keys: int | None = Field(default=None, description="in the list of tenants: how many of its keys work now")


class KeyObject(BaseModel):
    id: str
    object: Literal["api_key"] = "api_key"
    tenant: str
    created_at: int
    expires_at: int | None
    revoked_at: int | None
    replaces: str | None
    state: Literal["active", "expired", "revoked"]
    hint: str | None = Field(None, description="fs-…WXYZ: the secret's last four characters (none: a static key)")
    last_used_at: int | None = Field(None, description="to the minute; null: not used since it was made")
    secret: str | None = Field(None, description="only in the response that made the key")


class Rotated(BaseModel):
    object: Literal["api_key.rotation"] = "api_key.rotation"
    old: KeyObject
    new: KeyObject


class Listed(BaseModel):
    object: Literal["list"] = "list"
    data: list[TenantObject] | list[KeyObject]


def _tenant(t: Tenant, q: Quota, retention: RetentionPolicy | None) -> TenantObject:
    return TenantObject(id=t.id, name=t.name, created_at=t.created_at, quota=QuotaIn(**asdict(q)),
                        retention=None if retention is None else str(retention))


def _key(k: Key, secret: str | None = None) -> KeyObject:
    return KeyObject(id=k.id, tenant=k.tenant, created_at=k.created_at, expires_at=k.expires_at,
                     revoked_at=k.revoked_at, replaces=k.replaces, state=k.state, hint=k.hint,
                     last_used_at=k.last_used_at, secret=secret)


async def _store(request: Request, call: Any, *args: Any, refused: Entry | None = None) -> Any:
    """An admin's store operation, in a worker thread (it records itself in the audit trail, in its transaction);
    the store's refusals as 404 / 409, recorded as ``refused``. A change is seen by this server at once (its key
    cache dropped), by others sharing the database within ``KEY_CACHE_S``."""
    s: Services = request.app.state.services
    try:
        out = await anyio.to_thread.run_sync(call, *args)
    except TenantError as exc:
        if refused is not None:
            await anyio.to_thread.run_sync(s.config.repo.audit.record, refused.refused(str(exc)))
        if exc.kind == "exists":
            raise conflict(str(exc), "tenant_exists") from None
        raise APIError(404, str(exc), type="not_found_error", code=f"{exc.kind}") from None
    s.auth.forget()
    return out


def _did(request: Request, action: str, target: str, tenant: str | None = None, **detail: Any) -> Entry:
    return entry(request.state.caller, action, target, tenant, **detail)


def _audited(request: Request, action: str, **detail: Any) -> Callable[[str, str], Entry]:
    """The audit entry of a store operation, given what it made or changed and its tenant."""
    return lambda made, tenant: _did(request, action, made, tenant, **detail)


def _repo(request: Request) -> Repository:
    s: Services = request.app.state.services
    return s.config.repo


def _tenants(request: Request) -> TenantStore:
    return _repo(request).tenants


@router.post("/tenants", status_code=201)
async def create_tenant(request: Request, body: NewTenant) -> TenantObject:
    name = check_name(body.name, "name")
    repo = _repo(request)

    quota = body.quota.quota()

    own = None if body.retention is None else parse_policy(body.retention)

    def create() -> Tenant:
        tenant = repo.tenants.create_tenant(name, audit=_audited(request, "tenant.create", name=name,
                                                                 quota=asdict(quota), retention=body.retention))
        repo.quotas.set_quota(tenant.id, quota)
        repo.retention.set_policy(tenant.id, own)
        return tenant

    return _tenant(await _store(request, create, refused=_did(request, "tenant.create", name)), quota, own)


@router.get("/tenants")
async def list_tenants(request: Request) -> Listed:
    """Every tenant, oldest first, with its usage now, its number of sessions and of keys that work."""
    repo = _repo(request)

    def overview() -> list[TenantObject]:  # a read of each kind for all tenants, not one a tenant
        tenants = repo.tenants.tenants()
        sessions = repo.tenants.sessions([t.id for t in tenants])
        quotas, policies, keys = repo.quotas.everyone(), repo.retention.policies(), repo.tenants.all_keys()
        out = []
        for t in tenants:
            quota, used = quotas[t.id]
            row = _tenant(t, quota, policies.get(t.id))
            row.usage = UsageObject(requests_this_minute=used.requests, running_turns=used.turns,
                                    tokens_today=used.tokens)
            row.sessions = sessions[t.id]
            row.keys = sum(k.state == "active" for k in keys.get(t.id, ()))
            out.append(row)
        return out

    return Listed(data=await _store(request, overview))


@router.patch("/tenants/{tenant_id}")
async def change_tenant(request: Request, tenant_id: str, body: TenantChange) -> TenantObject:
    """A tenant's limits (in force for its next request on every server) or retention policy (for the next
    sweep), changed."""
    repo = _repo(request)
    retention = "retention" in body.model_fields_set

    def change() -> tuple[Tenant, Quota, RetentionPolicy | None]:
        tenant = repo.tenants.tenant(tenant_id)
        if body.quota is not None:  # merged: a limit left out stays, an explicit null clears it
            before, given = asdict(repo.quotas.quota(tenant_id)), asdict(body.quota.quota())
            quota = Quota(**{k: given[k] if k in body.quota.model_fields_set else before[k] for k in before})
            repo.quotas.set_quota(tenant_id, quota, _did(request, "tenant.quota", tenant_id, tenant_id,
                                                         quota=asdict(quota)))
        if retention:
            repo.retention.set_policy(tenant_id, None if body.retention is None else parse_policy(body.retention),
                                      _did(request, "tenant.retention", tenant_id, tenant_id, retention=body.retention))
        return tenant, repo.quotas.quota(tenant_id), repo.retention.policy(tenant_id)

    action = "tenant.quota" if body.quota is not None else "tenant.retention"
    return _tenant(*await _store(request, change, refused=_did(request, action, tenant_id, tenant_id)))


@router.post("/tenants/{tenant_id}/keys", status_code=201)
async def create_key(request: Request, tenant_id: str, body: NewKey | None = None) -> KeyObject:
    expires = None if body is None or body.expires_in is None else int(time.time()) + body.expires_in
    key, secret = await _store(request, _tenants(request).create_key, tenant_id, expires,
                               _audited(request, "key.create", expires_at=expires),
                               refused=_did(request, "key.create", tenant_id, tenant_id))
    return _key(key, secret)


@router.get("/tenants/{tenant_id}/keys")
async def list_keys(request: Request, tenant_id: str) -> Listed:
    return Listed(data=[_key(k) for k in await _store(request, _tenants(request).keys, tenant_id)])


@router.post("/keys/{key_id}/rotate")
async def rotate_key(request: Request, key_id: str, body: Rotation | None = None) -> Rotated:
    grace = DEFAULT_GRACE_S if body is None else body.grace_s
    old, new, secret = await _store(request, _tenants(request).rotate, key_id, grace,
                                    _audited(request, "key.rotate", rotated=key_id, grace_s=grace),
                                    refused=_did(request, "key.rotate", key_id))
    return Rotated(old=_key(old), new=_key(new, secret))


@router.delete("/keys/{key_id}")
async def revoke_key(request: Request, key_id: str) -> KeyObject:
    if not key_id.startswith("key_"):
        raise bad_request(f"{key_id!r} is not a key id (key_…)", "key_id", "invalid_key_id")
    return _key(await _store(request, _tenants(request).revoke, key_id, _audited(request, "key.revoke"),
                             refused=_did(request, "key.revoke", key_id)))


@router.post("/tenants/{tenant_id}/erasure")
async def erase_for_tenant(request: Request, tenant_id: str, body: ErasureIn) -> dict[str, Any]:
    """``POST /v1/erasure`` in the tenant's memory, by an admin (a person's request that reached the operator); the
    audit trail names the admin key. ``dry_run`` says what would go."""
    await _store(request, _tenants(request).tenant, tenant_id)
    return await erase_subject(request, tenant_id + "/", body, tenant_id)


class UsagePoint(BaseModel):
    start: int = Field(description="the hour's or day's start, unix seconds (UTC)")
    requests: int = Field(description="requests that ended in it")
    tokens: int = Field(description="model tokens they spent")
    refused: int = Field(description="requests its quota refused (429)")


class UsageHistory(BaseModel):
    object: Literal["list"] = "list"
    tenant: str
    bucket: Literal["hour", "day"]
    data: list[UsagePoint]


@router.get("/tenants/{tenant_id}/usage")
async def usage_history(request: Request, tenant_id: str, bucket: Literal["hour", "day"] = "hour",
                        since: float | None = None, until: float | None = None) -> UsageHistory:
    """The tenant's use over time, a point an hour or a day, every one from ``since`` to before ``until`` (unix
    seconds; by default the last 48 hours or 30 days, this one the last), at most 1000."""
    size = 3600 if bucket == "hour" else DAY
    end = time.time() if until is None else until
    start = (end // size - (47 if bucket == "hour" else 29)) * size if since is None else since  # now's, and before
    repo = _repo(request)
    await _store(request, repo.tenants.tenant, tenant_id)
    try:
        points = await anyio.to_thread.run_sync(repo.quotas.history, tenant_id, start, end, size)
    except ValueError as exc:
        raise bad_request(f"since {start:g} to until {end:g} by {bucket}: {exc}", "since", "invalid_range") from None
    return UsageHistory(tenant=tenant_id, bucket=bucket, data=[UsagePoint(**asdict(p)) for p in points])


class AuditObject(BaseModel):
    id: str
    object: Literal["audit.entry"] = "audit.entry"
    at: float
    tenant: str | None
    key: str | None
    actor: str
    action: str
    target: str
    result: str
    detail: dict[str, Any]


class AuditPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[AuditObject]
    has_more: bool
    last_id: str | None


@router.get("/audit")
async def audit(request: Request, since: float | None = None, until: float | None = None, tenant: str | None = None,
                action: str | None = None, actor: str | None = None, limit: int = 100,
                after: str | None = None) -> AuditPage:
    """The audit trail, oldest first: from ``since`` until before ``until`` (unix seconds), of one ``tenant``, of one
    ``action``, of one ``actor`` (admin, tenant, shell, server), a page of ``limit`` (1–1000) after the entry
    ``after``."""
    if not 1 <= limit <= MAX_PAGE:
        raise bad_request(f"limit is {limit}: 1 to {MAX_PAGE}", "limit", "invalid_limit")
    if action is not None and action not in ACTIONS:
        raise bad_request(f"unknown action {action!r}: {', '.join(ACTIONS)}", "action", "invalid_action")
    if actor is not None and actor not in ACTORS:
        raise bad_request(f"unknown actor {actor!r}: {', '.join(ACTORS)}", "actor", "invalid_actor")
    found, more = await anyio.to_thread.run_sync(
        lambda: _repo(request).audit.entries(since, tenant, action, limit, after, actor=actor, until=until))
    data = [AuditObject(id=e.id, at=e.at, tenant=e.tenant, key=e.key, actor=e.actor, action=e.action, target=e.target,
                        result=e.result, detail=dict(e.detail)) for e in found]
    return AuditPage(data=data, has_more=more, last_id=data[-1].id if data else None)
