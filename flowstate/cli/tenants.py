"""``flowstate tenants …`` and ``flowstate keys …``: tenants and their API keys on a database, from the shell (what
``/v1/admin/…`` does over HTTP). A running server sees a change within its key cache's bound (2 s)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import click

from flowstate.cli.options import default_db, errors
from flowstate.errors import StorageError
from flowstate.store import chain
from flowstate.store.audit import ACTIONS, MAX_PAGE, Entry
from flowstate.store.quotas import Quota
from flowstate.store.repository import Repository
from flowstate.store.tenants import TenantError, TenantStore


def _remember_create(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    ctx.meta["flowstate.create"] = value
    return value


def DB(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--db`` and ``--create``: a database that holds no FlowState memory (a missing file, a PostgreSQL database
    without its tables) is refused unless ``--create`` says a new one is meant — a mistyped name is not a new, empty
    memory."""
    fn = click.option("--create", is_flag=True, expose_value=False, callback=_remember_create,
                      help="Make the database's FlowState tables (a new SQLite file) if it has none [default: a "
                           "database without them is refused].")(fn)
    return click.option("--db", default=None,
                        help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")(fn)
MAX_GRACE_S = 30 * 86_400


@contextmanager
def _repo(db: str | None) -> Iterator[Repository]:
    with errors():
        create = bool(click.get_current_context().meta.get("flowstate.create"))
        try:
            chain.key()  # every action here is audited: a key too short is refused before any
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        try:
            repo = Repository.open(db or default_db(), create=create)
        except StorageError as exc:
            if create or not any(s in str(exc) for s in ("no database at", "not a FlowState database")):
                raise
            raise StorageError(f"{exc} (--create makes a new one)") from None
        try:
            yield repo
        except TenantError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            repo.close()


@contextmanager
def _store(db: str | None) -> Iterator[TenantStore]:
    with _repo(db) as repo:
        yield repo.tenants


def _shell(action: str, **detail: Any) -> Callable[[str, str], Entry]:
    """The audit entry of a shell operation (actor "shell": whoever can open the database)."""
    return lambda made, tenant: Entry(action, made, "shell", None, tenant, detail=detail)


def _echo(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


@click.group()
def tenants() -> None:
    """Tenants: who owns memory (a tenant's id is the namespace of its sessions)."""


def quota_options(fn: Any) -> Any:
    for flag, name, top, what in (("--rpm", "requests_per_minute", 1_000_000, "requests per minute"),
                                  ("--turns", "concurrent_turns", 100_000, "turns running at once"),
                                  ("--daily-tokens", "tokens_per_day", 10**13, "model tokens per UTC day")):
        fn = click.option(flag, name, type=click.IntRange(0, top), default=0, show_default=True,
                          help=f"The tenant's limit on {what} (0: none).")(fn)
    return fn


def _quota(limits: dict[str, int]) -> Quota:
    return Quota(**{k: v or None for k, v in limits.items()})


@tenants.command("create")
@click.argument("name")
@quota_options
@DB
def create_tenant(name: str, db: str | None, **limits: int) -> None:
    """Make a tenant named NAME, with its limits; print it."""
    from serving.errors import APIError
    from serving.naming import check_name

    try:
        check_name(name, "name")
    except APIError as exc:
        raise click.BadParameter(exc.message, param_hint="NAME") from None
    with _repo(db) as repo:
        tenant = repo.tenants.create_tenant(name, audit=_shell("tenant.create", name=name,
                                                                quota=asdict(_quota(limits))))
        repo.quotas.set_quota(tenant.id, _quota(limits))
        _echo({**asdict(tenant), "quota": asdict(repo.quotas.quota(tenant.id))})


@tenants.command("quota")
@click.argument("tenant")
@quota_options
@DB
def set_quota(tenant: str, db: str | None, **limits: int) -> None:
    """Set TENANT's limits (each one given; 0 for none); a running server applies them to its next request."""
    with _repo(db) as repo:
        repo.tenants.tenant(tenant)
        repo.quotas.set_quota(tenant, _quota(limits), _shell("tenant.quota", quota=asdict(_quota(limits)))(tenant,
                                                                                                          tenant))
        _echo({"tenant": tenant, "quota": asdict(repo.quotas.quota(tenant)),
               "usage": asdict(repo.quotas.usage(tenant))})


@tenants.command("retention")
@click.argument("tenant")
@click.argument("policy")
@DB
def set_retention(tenant: str, policy: str, db: str | None) -> None:
    """Set how long TENANT's memory is kept: POLICY is idle=30d,age=180d (either bound alone), off (kept until
    deleted), or default (the server's --retention). A running server's next sweep applies it."""
    from flowstate.cli.forgetting import POLICY

    own = None if policy == "default" else POLICY.convert(policy, None, None)
    with _repo(db) as repo:
        repo.tenants.tenant(tenant)
        repo.retention.set_policy(tenant, own, _shell("tenant.retention", retention=policy)(tenant, tenant))
        _echo({"tenant": tenant, "retention": None if own is None else str(own)})


@tenants.command("list")
@DB
def list_tenants(db: str | None) -> None:
    """Every tenant, oldest first."""
    with _store(db) as store:
        _echo([asdict(t) for t in store.tenants()])


@click.group()
def keys() -> None:
    """API keys: what proves a caller is a tenant (stored as digests; a secret is printed once, when made)."""


@keys.command("create")
@click.argument("tenant")
@click.option("--expires-in", type=click.IntRange(60, 10 * 365 * 86_400), default=None,
              help="Seconds the key works [default: until revoked].")
@DB
def create_key(tenant: str, expires_in: int | None, db: str | None) -> None:
    """Make a key for TENANT (its id); print it with its secret, which is not kept anywhere."""
    with _store(db) as store:
        expires = None if expires_in is None else int(time.time()) + expires_in
        key, secret = store.create_key(tenant, expires, _shell("key.create", expires_at=expires))
        _echo({**asdict(key), "secret": secret})


@keys.command("list")
@click.argument("tenant")
@DB
def list_keys(tenant: str, db: str | None) -> None:
    """TENANT's keys (never their secrets)."""
    with _store(db) as store:
        _echo([asdict(k) for k in store.keys(tenant)])


@keys.command("rotate")
@click.argument("key_id")
@click.option("--grace", "grace_s", type=click.IntRange(0, MAX_GRACE_S), default=3600, show_default=True,
              help="Seconds the old key goes on working.")
@DB
def rotate_key(key_id: str, grace_s: int, db: str | None) -> None:
    """A new key for KEY_ID's tenant; KEY_ID stops working after the grace period. Prints both (the new one's secret
    once)."""
    with _store(db) as store:
        old, new, secret = store.rotate(key_id, grace_s, _shell("key.rotate", rotated=key_id, grace_s=grace_s))
        _echo({"old": asdict(old), "new": {**asdict(new), "secret": secret}})


@keys.command("revoke")
@click.argument("key_id")
@DB
def revoke_key(key_id: str, db: str | None) -> None:
    """Stop KEY_ID now (every server sharing the database refuses it within 2 s)."""
    with _store(db) as store:
        _echo(asdict(store.revoke(key_id, _shell("key.revoke"))))


@click.command("audit")
@click.option("--since", type=float, default=None, help="From this time on (unix seconds) [default: the start].")
@click.option("--tenant", default=None, help="Only this tenant's entries.")
@click.option("--action", type=click.Choice(ACTIONS), default=None, help="Only this action.")
@click.option("--limit", type=click.IntRange(1, MAX_PAGE), default=100, show_default=True, help="Entries a page.")
@click.option("--after", default=None, help="The page after this entry id (the last one printed).")
@click.option("--verify", is_flag=True, help="Check the trail's hash chain instead (under $FLOWSTATE_AUDIT_KEY if "
              "the deployment sets one): print what it found, its head to record elsewhere, and exit 1 if broken.")
@click.option("--expect", metavar="SEQ:DIGEST", default=None,
              help="With --verify: a head printed earlier, which must still be in the chain.")
@DB
def audit(since: float | None, tenant: str | None, action: str | None, limit: int, after: str | None, verify: bool,
          expect: str | None, db: str | None) -> None:
    """The audit trail: every admin action (tenants, quotas, retention, keys), data action (export, import, delete,
    search, an admin's read, erasure, feedback) and retention's removals, oldest first, one JSON object a line; the
    next page's --after last, if there is one. With --verify, whether it is as written (docs/tenants.md)."""
    if expect is not None and not verify:
        raise click.UsageError("--expect goes with --verify")
    with _repo(db) as repo:
        if verify:
            try:
                verdict = repo.audit.verify(expect)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
            _echo({**asdict(verdict), "intact": verdict.intact})
            if not verdict.intact:
                raise SystemExit(1)
            return
        found, more = repo.audit.entries(since, tenant, action, limit, after)
    for e in found:
        click.echo(json.dumps({**asdict(e), "detail": dict(e.detail)}, ensure_ascii=False, sort_keys=True))
    if more and found:
        click.echo(f"more: --after {found[-1].id}", err=True)


@click.command("grant")
@click.argument("role")
@click.option("--db", required=True, help="The PostgreSQL database, as its tables' owner (a postgresql:// URL).")
def grant_role(role: str, db: str) -> None:
    """Give ROLE (an existing PostgreSQL role) what a server needs on the database and no more: every table read and
    written, the audit trail only read and appended to, no table owned — so a server's URL cannot drop a trigger or
    rewrite the trail. Serve with ROLE's URL after; run again after an upgrade (docs/tenants.md)."""
    from flowstate.store import roles
    from flowstate.store.backends import is_postgres, redact

    if not is_postgres(db):
        raise click.BadParameter("a postgresql:// URL (SQLite has no roles: whoever can write the file owns it; "
                                 "flowstate audit --verify shows a rewrite)", param_hint="--db")
    with _repo(db):  # applies any migration first, as the owner
        pass
    import psycopg

    try:
        with psycopg.connect(db, autocommit=True) as conn:
            for line in roles.grant(conn, role):
                click.echo(line)
    except (psycopg.Error, ValueError) as exc:
        raise click.ClickException(f"{redact(db)}: {str(exc).strip()}") from None
