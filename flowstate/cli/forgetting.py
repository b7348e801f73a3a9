"""``flowstate retention``: what has outlived its retention policy, listed (``--dry-run``) or removed, on a database
from the shell (a server sweeps by itself with ``serve --retention``); ``flowstate erase``: a subject's memory
erased, with its receipt; ``flowstate vault-key``: a new key for redaction's vault."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from typing import Any

import click

from flowstate.cli.options import default_db, errors
from flowstate.store.audit import Entry
from flowstate.store.repository import Repository
from flowstate.store.retention import PolicyError, RetentionPolicy, parse_policy
from flowstate.store.server_lock import InUse, unserved


class PolicyParam(click.ParamType[RetentionPolicy, Any]):
    """A retention policy on the command line: ``idle=30d,age=180d``, either bound alone, or ``off``."""

    name = "policy"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> RetentionPolicy:
        if isinstance(value, RetentionPolicy):
            return value
        try:
            return parse_policy(str(value))
        except PolicyError as exc:
            self.fail(str(exc), param, ctx)


POLICY = PolicyParam()


@click.command()
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@click.option("--policy", type=POLICY, default="off", show_default=True,
              help="The server's policy (idle=30d,age=180d; off): tenants with a policy of their own keep theirs.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
def retention(db: str | None, policy: RetentionPolicy, dry_run: bool) -> None:
    """Remove (or with --dry-run, list) the sessions, stored responses and conversations that outlived their
    retention policy; print them as JSON lines (kind, name, tenant, why: the policy and the time past it; a session's
    stored responses, which go with it), then a count per kind on stderr."""
    now = time.time()
    with errors(), Repository.open(db or default_db(), create=False) as repo:
        found = repo.retention.sweep(policy, now, actor="shell", dry_run=dry_run)
    for e in found:
        with_it = {"responses": e.responses} if e.kind == "session" else {}
        click.echo(json.dumps({"kind": e.kind, "name": e.name, "tenant": e.tenant, "why": e.why, **with_it},
                              ensure_ascii=False))
    counts = {k: sum(e.kind == k for e in found) for k in ("session", "response", "conversation")}
    click.echo(f"{'would remove' if dry_run else 'removed'}: " + ", ".join(f"{n} {k}(s)" for k, n in counts.items()),
               err=True)


@click.command()
@click.argument("subject")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@click.option("--tenant", default=None, help="The tenant whose subject it is (its id) [default: the open namespace].")
@click.option("--api-key", default=None, help="... or the tenant of this API key.")
@click.option("--vacuum-full", is_flag=True,
              help="PostgreSQL: VACUUM FULL the affected tables and rebuild the search index, so no file of theirs "
                   "keeps the erased rows (an exclusive lock on them while it runs).")
def erase(subject: str, db: str | None, tenant: str | None, api_key: str | None, vacuum_full: bool) -> None:
    """Erase SUBJECT — a session name or an end-user id (a `user`, a value of a conversation's metadata) — with
    every fork, response, conversation, transcript and search row that names it; print the receipt (JSON). On
    SQLite, erase through the server (POST /v1/erasure) while one runs: it holds sessions in memory, and this
    command refuses while a server holds the database."""
    if tenant and api_key:
        raise click.UsageError("give --tenant or --api-key, not both")
    with errors(), Repository.open(db or default_db(), create=False) as repo, ExitStack() as held:
        if not repo.shared:  # held to the end: no server starts on the database while it is erased
            try:
                held.enter_context(unserved(repo.path))
            except InUse:
                raise click.ClickException(f"a running server uses {repo.path} and holds its sessions in memory: "
                                           "erase through it (POST /v1/erasure), or stop it first; nothing was "
                                           "erased") from None
        if tenant:
            repo.tenants.tenant(tenant)
        ns = f"{tenant}/" if tenant else repo.tenants.namespace_of(api_key) if api_key else ""
        if repo.shared:  # every server's turns of these sessions wait, and a running one is waited for
            for name in sorted(repo.erasure.sessions_of(ns, subject)):
                held.enter_context(repo.session_lock(name))
        receipt = repo.erasure.erase(ns, subject, Entry("subject.erase", "", "shell", None, ns[:-1] or None))
        held.close()
        receipt = repo.erasure.keep_storage(receipt, repo.erasure.scrub(full=vacuum_full))
    click.echo(json.dumps(receipt.to_dict(), ensure_ascii=False, indent=2))


@click.command("vault-key")
def vault_key() -> None:
    """Print a new vault key for `serve --redact mask` ($FLOWSTATE_VAULT_KEY): a Fernet key, made without the redact
    extra. Keep it outside the database: without it no redacted value can be recovered."""
    from flowstate.store.vault import new_key

    click.echo(new_key())
