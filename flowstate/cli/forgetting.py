"""``flowstate retention``: what has outlived its retention policy, listed (``--dry-run``) or removed, on a database
from the shell (a server sweeps by itself with ``serve --retention``)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from flowstate.cli.options import default_db, errors
from flowstate.store.repository import Repository
from flowstate.store.retention import Policy, PolicyError, parse_policy


class PolicyParam(click.ParamType[Policy, Any]):
    """A retention policy on the command line: ``idle=30d,age=180d``, either bound alone, or ``off``."""

    name = "policy"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Policy:
        if isinstance(value, Policy):
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
def retention(db: str | None, policy: Policy, dry_run: bool) -> None:
    """Remove (or with --dry-run, list) the sessions, stored responses and conversations that outlived their
    retention policy; print them as JSON lines (kind, name, tenant), then a count per kind on stderr."""
    now = time.time()
    with errors(), Repository.open(db or default_db(), create=False) as repo:
        found = repo.retention.sweep(policy, now, actor="shell", dry_run=dry_run)
    for e in found:
        click.echo(json.dumps({"kind": e.kind, "name": e.name, "tenant": e.tenant}, ensure_ascii=False))
    counts = {k: sum(e.kind == k for e in found) for k in ("session", "response", "conversation")}
    click.echo(f"{'would remove' if dry_run else 'removed'}: " + ", ".join(f"{n} {k}(s)" for k, n in counts.items()),
               err=True)
