"""``flowstate search``: the memory search the endpoint serves at ``/v1/memory/search``, from the shell."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from flowstate.cli.options import default_db, errors
from flowstate.store.repository import Repository
from flowstate.store.search import MAX_LIMIT, Search


@click.command()
@click.argument("query")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@click.option("--api-key", default=None, help="Only the sessions of this API key's tenant, named as its keys name them "
                                              "[default: every session of the database, by its stored name].")
@click.option("--type", "types", default=None, help="State types, comma-separated (preference, knowledge, attribute, "
                                                    "judgement, artifact) [default: any].")
@click.option("--session", default=None, help="Only this session (a fork: with the states it shares).")
@click.option("--since", default=None, help="Written at or after: an ISO 8601 date or time, or unix seconds.")
@click.option("--until", default=None, help="Written at or before (a date: to its end).")
@click.option("--in", "in_", default="states", show_default=True, help="What to search: states, observations, or both "
                                                                     "(states,observations).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, MAX_LIMIT), help="Hits per page.")
@click.option("--after", default=None, help="The cursor a previous page printed, for the next page.")
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON (hits, has_more, next).")
def search(query: str, db: str | None, api_key: str | None, types: str | None, session: str | None,
           since: str | None, until: str | None, in_: str, limit: int, after: str | None, as_json: bool) -> None:
    """Search the states (and raw observations) of a database's sessions, best match first."""
    with errors():
        what = Search.parse(query, type=types, session=session, since=since, until=until, limit=limit, after=after,
                            in_=in_)
        repo = Repository.open(db or default_db(), create=False)
        try:
            namespace = repo.tenants.namespace_of(api_key) if api_key else ""
            hits, more = repo.catalog.search(namespace, what)
        finally:
            repo.close()
        nxt = what.cursor(what.offset + what.limit) if more else None
        if as_json:
            rows = [{**asdict(h), "session": h.session[len(namespace):]} for h in hits]
            click.echo(json.dumps({"data": rows, "has_more": more, "next": nxt}, ensure_ascii=False, indent=2))
            return
        if not hits:
            click.echo("no state matches")
        for h in hits:
            click.echo(f"{h.score:8.3f}  {h.session[len(namespace):]}  request {h.request}  {h.state_id} "
                       f"({h.type if h.kind == 'state' else 'observation'}): {h.summary}")
        if nxt is not None:
            click.echo(f"more: --after {nxt}")
