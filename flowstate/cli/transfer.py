"""``flowstate export`` and ``flowstate import``: sessions as a portable file, between databases and servers."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from flowstate.cli.options import default_db, errors
from flowstate.store.repository import Repository
from flowstate.store.transfer import renames


def _namespace(repo: Repository, api_key: str | None) -> str:
    return repo.tenants.namespace_of(api_key) if api_key else ""


KEY_HELP = ("The sessions of this API key's tenant, named as its keys name them (what the endpoint's key sees) "
            "[default: the database's stored names].")


@click.command("export")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@click.option("--session", "sessions", multiple=True, help="A session to export (repeatable).")
@click.option("--all", "everything", is_flag=True, help="Every session (of --api-key's namespace, with one).")
@click.option("--api-key", default=None, help=KEY_HELP)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The file to write (JSON Lines; '-' for standard output).")
def export(db: str | None, sessions: tuple[str, ...], everything: bool, api_key: str | None, out: Path) -> None:
    """Write sessions — requests, states, relations, transcripts, responses, forks — to a portable file."""
    with errors():
        if bool(sessions) == everything:
            raise click.UsageError("give --session NAME (repeatable) or --all")
        with Repository.open(db or default_db(), create=False) as repo:
            namespace = _namespace(repo, api_key)
            names = repo.sessions(namespace) if everything else [namespace + s for s in sessions]
            lines = repo.transfer.export(names, namespace)
        if str(out) == "-":
            sys.stdout.writelines(lines)
            return
        tmp = out.with_name(out.name + ".part")
        with tmp.open("w", encoding="utf-8", newline="\n") as f:
            f.writelines(lines)
        tmp.replace(out)  # never a half-written file under the name asked for
        click.echo(f"exported {len(names)} session(s), {len(lines) - 1} lines, to {out}", err=True)


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@click.option("--rename", multiple=True, metavar="OLD=NEW", help="Import session OLD as NEW (repeatable).")
@click.option("--api-key", default=None, help=KEY_HELP)
def import_(file: Path, db: str | None, rename: tuple[str, ...], api_key: str | None) -> None:
    """Read a session file into a database, all or nothing (a taken name is refused unless renamed)."""
    with errors():
        try:
            renamed = renames(rename)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--rename") from None
        with Repository.open(db or default_db()) as repo, file.open(encoding="utf-8", newline="") as f:
            names = repo.transfer.load(f, _namespace(repo, api_key), renamed)
        click.echo(f"imported {len(names)} session(s): {', '.join(names)}")
