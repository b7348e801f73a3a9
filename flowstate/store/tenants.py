"""Tenants and their API keys, on the repository's database: who owns memory (a tenant: a stable id, which is the
namespace of its sessions) and what proves who is calling (a key: stored only as its SHA-256 digest, shown once when
made, with an optional expiry; rotated by making a new one and letting the old one expire after a grace period)."""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from flowstate.errors import StorageError
from flowstate.store.audit import new_id, write
from flowstate.store.backends import Backend, Conn

SECRET_PREFIX = "fs-"  # a managed key's secret: fs- and 43 URL-safe characters (256 random bits)
LEGACY_PREFIX = "k"  # a static key's tenant (adopted from --api-key): "k" + the first 16 hex digits of its digest


class TenantError(StorageError):
    """An operation on tenants or keys the store refuses: ``kind`` is ``not_found`` or ``exists``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Tenant:
    id: str  # the namespace of its sessions (and of everything stored under them)
    name: str
    created_at: int


@dataclass(frozen=True)
class Key:
    """A key as stored: never its secret."""

    id: str
    tenant: str
    created_at: int
    expires_at: int | None  # unix seconds; None: until revoked
    revoked_at: int | None
    replaces: str | None  # the key this one was rotated from
    hint: str | None = None  # fs-…WXYZ: a managed key's last four characters (None: a static key, or made before)
    last_used_at: int | None = None  # to the minute (``USE_RESOLUTION_S``); None: never used since it was kept

    @property
    def state(self) -> Literal["active", "expired", "revoked"]:
        """``active``, ``revoked`` or ``expired`` (now); a rotated key in its grace is active, with an expiry."""
        if self.revoked_at is not None:
            return "revoked"
        return "active" if self.valid(time.time()) else "expired"

    def valid(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def digest(secret: str) -> str:
    """What the store keeps of a secret. Keys are 256 random bits (or an operator's static key), so one SHA-256 is
    enough: a dump of the database holds nothing a client could send."""
    return hashlib.sha256(secret.encode()).hexdigest()


def legacy_tenant(secret: str) -> str:
    """The tenant id a static key has always named its sessions by (``"k" + sha256(key)[:16]``)."""
    return LEGACY_PREFIX + digest(secret)[:16]


Audited = Callable[[str, str], Any] | None
"""What to record in the audit trail, as a function of what the operation made or changed and its tenant (two ids),
written in its transaction by ``flowstate.store.audit.write`` (None: nothing is recorded)."""


def _audit(conn: Conn, audit: Audited, made: str, tenant: str) -> None:
    if audit is not None:
        write(conn, audit(made, tenant))


_KEY = "SELECT id, tenant_id, created_at, expires_at, revoked_at, replaces, hint, last_used_at FROM api_keys"
USE_RESOLUTION_S = 60  # a key's last use is written at most once this often (a write per request would not pay)


def hint(secret: str) -> str:
    return SECRET_PREFIX + "…" + secret[-4:]


class TenantStore:
    """Tenants and keys, one transaction per operation, on the database the sessions live in (both backends)."""

    def __init__(self, backend: Backend) -> None:
        self._db = backend

    def create_tenant(self, name: str, tenant_id: str | None = None, audit: Audited = None) -> Tenant:
        """A new tenant; ``audit`` (a function of the tenant made) is recorded in its transaction."""
        tenant = Tenant(tenant_id or new_id("t"), name, int(time.time()))
        with self._db.write(f"cannot create tenant {name!r}") as conn:
            if conn.execute("SELECT 1 FROM tenants WHERE name = ? OR id = ?", (name, tenant.id)).fetchone():
                raise TenantError(f"a tenant named {name!r} exists", "exists")
            conn.execute("INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)",
                         (tenant.id, tenant.name, tenant.created_at))
            _audit(conn, audit, tenant.id, tenant.id)
        return tenant

    def tenant(self, tenant_id: str) -> Tenant:
        with self._db.read() as conn:
            row = conn.execute("SELECT id, name, created_at FROM tenants WHERE id = ?", (tenant_id,)).fetchone()
        if row is None:
            raise TenantError(f"no tenant {tenant_id!r}", "not_found")
        return Tenant(*row)

    def tenants(self) -> list[Tenant]:
        with self._db.read() as conn:
            return [Tenant(*r)
                    for r in conn.execute("SELECT id, name, created_at FROM tenants ORDER BY created_at, id")]

    def create_key(self, tenant_id: str, expires_at: int | None = None, audit: Audited = None) -> tuple[Key, str]:
        """A new key of the tenant and its secret (the only time the secret exists outside the client)."""
        with self._db.write(f"cannot make a key for tenant {tenant_id!r}") as conn:
            key, secret = self._insert_key(conn, tenant_id, expires_at, None)
            _audit(conn, audit, key.id, tenant_id)
            return key, secret

    @staticmethod
    def _insert_key(conn: Conn, tenant_id: str, expires_at: int | None, replaces: str | None,
                    secret: str | None = None) -> tuple[Key, str]:
        if conn.execute("SELECT 1 FROM tenants WHERE id = ?", (tenant_id,)).fetchone() is None:
            raise TenantError(f"no tenant {tenant_id!r}", "not_found")
        managed = secret is None  # a static key's secret is the operator's: no part of it is shown
        secret = secret or SECRET_PREFIX + secrets.token_urlsafe(32)
        key = Key(new_id("key_"), tenant_id, int(time.time()), expires_at, None, replaces,
                  hint(secret) if managed else None)
        conn.execute("INSERT INTO api_keys (id, tenant_id, digest, created_at, expires_at, replaces, hint) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                     (key.id, tenant_id, digest(secret), key.created_at, expires_at, replaces, key.hint))
        return key, secret

    def all_keys(self) -> dict[str, list[Key]]:
        """Every tenant's keys (those it has), by tenant, in one query."""
        out: dict[str, list[Key]] = {}
        with self._db.read() as conn:
            for r in conn.execute(_KEY + " ORDER BY tenant_id, id"):
                out.setdefault(r[1], []).append(Key(*r))
        return out

    def keys(self, tenant_id: str) -> list[Key]:
        self.tenant(tenant_id)
        with self._db.read() as conn:
            return [Key(*r) for r in conn.execute(_KEY + " WHERE tenant_id = ? ORDER BY id", (tenant_id,))]

    def key(self, key_id: str) -> Key:
        with self._db.read() as conn:
            row = conn.execute(_KEY + " WHERE id = ?", (key_id,)).fetchone()
        if row is None:
            raise TenantError(f"no key {key_id!r}", "not_found")
        return Key(*row)

    def rotate(self, key_id: str, grace_s: int, audit: Audited = None) -> tuple[Key, Key, str]:
        """A new key for the old one's tenant (same expiry rule), the old one now ending ``grace_s`` seconds from
        now (or sooner, if it already would): (the old key as it is now, the new key, its secret)."""
        with self._db.write(f"cannot rotate key {key_id!r}") as conn:
            row = conn.execute(_KEY + " WHERE id = ?", (key_id,)).fetchone()
            if row is None or Key(*row).revoked_at is not None:
                raise TenantError(f"no key {key_id!r}" if row is None else f"key {key_id!r} is revoked", "not_found")
            old = Key(*row)
            now = math.ceil(time.time())  # whole seconds, rounded up: the grace is never shorter than asked
            ends = now + grace_s if old.expires_at is None else min(old.expires_at, now + grace_s)
            lifetime = None if old.expires_at is None else max(old.expires_at - old.created_at, 1)
            key, secret = self._insert_key(conn, old.tenant, None if lifetime is None else now + lifetime, old.id)
            conn.execute("UPDATE api_keys SET expires_at = ? WHERE id = ?", (ends, old.id))
            _audit(conn, audit, key.id, old.tenant)
        return replace(old, expires_at=ends), key, secret

    def revoke(self, key_id: str, audit: Audited = None) -> Key:
        with self._db.write(f"cannot revoke key {key_id!r}") as conn:
            row = conn.execute(_KEY + " WHERE id = ?", (key_id,)).fetchone()
            if row is None:
                raise TenantError(f"no key {key_id!r}", "not_found")
            now = int(time.time())
            conn.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now, key_id))
            _audit(conn, audit, key_id, Key(*row).tenant)
        return self.key(key_id)

    def lookup(self, key_digest: str) -> Key | None:
        """The key with this digest (valid or not), or None."""
        with self._db.read() as conn:
            row = conn.execute(_KEY + " WHERE digest = ?", (key_digest,)).fetchone()
        return None if row is None else Key(*row)

    def used(self, key: Key, now: float) -> None:
        """Note that ``key`` was used now, unless a use under ``USE_RESOLUTION_S`` ago is noted. A database too busy
        to take it loses the note, never the request."""
        try:
            with self._db.write("cannot note a key's use") as conn:
                conn.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR "
                             "last_used_at < ?)", (int(now), key.id, int(now) - USE_RESOLUTION_S))
        except StorageError:
            pass

    def sessions(self, tenant_ids: list[str]) -> dict[str, int]:
        """How many sessions each tenant has (its namespace's), in one read."""
        with self._db.read() as conn:
            return {t: conn.execute("SELECT COUNT(*) FROM sessions WHERE substr(name, 1, ?) = ?",
                                    (len(t) + 1, t + "/")).fetchone()[0] for t in tenant_ids}

    def adopt(self, secret: str) -> Key:
        """A static key (``--api-key``) as a managed one, once: its tenant is the namespace its sessions already
        have (``legacy_tenant``), so nothing it stored moves; a key adopted before is left as it is (rotated or
        revoked stays so, however often the server starts with it)."""
        found = self.lookup(digest(secret))
        if found is not None:
            return found
        tenant = legacy_tenant(secret)
        with self._db.write("cannot adopt a static API key") as conn:  # two servers may adopt it at once
            conn.execute("INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                         (tenant, tenant, int(time.time())))
            self._insert_key(conn, tenant, None, None, secret)
        found = self.lookup(digest(secret))
        assert found is not None
        return found

    def namespace_of(self, secret: str) -> str:
        """The namespace of the key's tenant (a static key never adopted: the one it would be adopted as)."""
        key = self.lookup(digest(secret))
        return (legacy_tenant(secret) if key is None else key.tenant) + "/"

    def any_keys(self) -> bool:
        with self._db.read() as conn:
            return conn.execute("SELECT 1 FROM api_keys LIMIT 1").fetchone() is not None
