"""Commands on one session: run a request, inspect a session, the hotel demo."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import click

import engine as engines
from flowstate import memory
from flowstate.agent import Agent
from flowstate.cli.options import (
    LoopOptions,
    McpOptions,
    default_db,
    engine_options,
    errors,
    layout_option,
    loop_options,
    mcp_options,
)
from flowstate.errors import FlowStateError, RequestFailed
from flowstate.inspection import render_graph, session_dump
from flowstate.loop import require_query
from flowstate.records import RunRecord, unfinished_message
from flowstate.store.repository import Repository


@click.command()
@click.argument("query")
@click.option("--session", default="default", show_default=True,
              help="Session name; the next run in it is the next request.")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: $FLOWSTATE_DB or "
                                         "~/.local/share/flowstate/flowstate.db].")
@engine_options
@click.option("--tools", "tools_ref", default=None, help="Tool set as module:attribute [default: no tools].")
@mcp_options
@click.option("--policy", default="", help="Task policy placed in the system prompt.")
@loop_options()
@layout_option
@click.option("--json", "as_json", is_flag=True, help="Print the full run record as JSON.")
def run(
    query: str, session: str, db: str | None, tools_ref: str | None, policy: str, loop: LoopOptions, layout: str,
    as_json: bool, mcp: McpOptions, **engine_opts: Any,
) -> None:
    """Run one request QUERY in a session and print the final response."""
    with errors():
        require_query(query)  # bad input fails before anything touches the database
        strategy = memory.get(*memory.laid_out((memory.DEFAULT,), layout))
        tools = mcp.tools(tools_ref)
        try:
            model = engines.load(**engine_opts)
            with Repository.open(db or default_db()) as repo:
                config = loop.config(model)
                agent = Agent(model, repository=repo, session=session, tools=tools, task_policy=policy,
                              config=config, strategy=strategy)
                record = agent.run(query)
        finally:
            tools.close()
        if as_json:
            click.echo(json.dumps(record.to_dict(), ensure_ascii=False, indent=2))
        elif record.response is None:
            click.echo(unfinished_message(record.unfinished, record.persisted_states))
        else:
            click.echo(record.response)


@click.command()
@click.option("--session", required=True, help="Session name.")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@click.option("--json", "as_json", is_flag=True, help="Print requests, index and nodes as JSON.")
def inspect(session: str, db: str | None, as_json: bool) -> None:
    """Show a session's requests, Historical State Index and state graph."""
    with errors():
        repo = Repository.open(db or default_db(), create=False)
        try:
            dump = session_dump(repo, session)
        finally:
            repo.close()
        if as_json:
            click.echo(json.dumps(dump, ensure_ascii=False, indent=2))
        else:
            click.echo(render_graph(dump))
            click.echo("\nHistorical State Index (what the next request's prompt lists):")
            for entry in dump["index"]:
                click.echo(json.dumps(entry, ensure_ascii=False))


@click.command()
@engine_options
@loop_options(max_steps=4)
@click.option("--db", default=None, help="Keep the demo's memory in this database, a file or a postgresql:// URL "
                                         "[default: a temporary one].")
@click.option("--session", default="hotel-demo", show_default=True, help="Session name in the database.")
@click.option("--json", "as_json", is_flag=True, help="Print the three run records as JSON.")
def demo(
    db: str | None, session: str, as_json: bool, loop: LoopOptions, **engine_opts: Any,
) -> None:
    """The hotel case of the paper's Figure 1: three requests, then the state graph.

    With ``--engine scripted`` the shipped script replays a model that solves it; with a real
    model, a request that fails is reported and the demo goes on with the next one.
    """
    from flowstate.demo import hotel

    with errors():
        if engine_opts["name"] == "scripted" and engine_opts["script"] is None:
            engine_opts["script"] = str(hotel.script_path())
        model = engines.load(**engine_opts)
        config = loop.config(model)
        with tempfile.TemporaryDirectory() as tmp:
            repo = Repository.open(db or Path(tmp) / "demo.db")
            try:
                if repo.request_count(session):
                    raise FlowStateError(f"session {session!r} in {repo.path} already has requests; "
                                         "name a new --session")
                agent = Agent(model, repository=repo, session=session, tools=hotel.TOOLS, task_policy=hotel.POLICY,
                              config=config)
                records: list[dict[str, Any]] = []
                if not as_json:
                    click.echo(intro(engine_opts, db, session))
                for query in hotel.QUERIES:
                    if not as_json:
                        click.echo(f"\n> {query}")
                    try:
                        record = agent.run(query)
                    except RequestFailed as exc:
                        records.append({"query": query, "error": str(exc), **(exc.record or {})})
                        if not as_json:
                            for step in records[-1].get("steps", []):
                                click.echo(_step_line(step))
                            kept = ("kept in the session as an unfinished request" if exc.persisted
                                    else "nothing of it was persisted")
                            click.echo(f"  {exc} ({kept})")
                        continue
                    records.append(record.to_dict())
                    if not as_json:
                        for step in records[-1]["steps"]:
                            click.echo(_step_line(step))
                        response = record.response
                        if response is None:
                            response = unfinished_message(record.unfinished, record.persisted_states)
                        click.echo(f"{response}\n  ({_usage_line(record)})")
                dump = session_dump(repo, session)
            finally:
                repo.close()
        if as_json:
            click.echo(json.dumps({"requests": records, "memory": dump}, ensure_ascii=False, indent=2))
        else:
            click.echo("\n" + render_graph(dump))


CASE = ("The hotel case of the FlowState paper's Figure 1: book hotel A ($200, an $80 cancellation fee) meaning to "
        "switch if B gets cheaper, book an airport transfer, then B drops to $160 — switch? Keeping A is right: "
        "switching costs $160 + $80 = $240, which only the first request's booking observation says.")
STEPS = ("Each step line: disclose ID (PSA brought an earlier request's state into this one), add/update ID (ISU "
         "committed it), N rejected (operations the B.4 rules refused, each fed back to the model with its rule), "
         "call TOOL, then act / answer / wait; \"protocol error in BLOCK; retry\" is an output that was not the four "
         "blocks, retried.")


def intro(engine_opts: dict[str, Any], db: str | None, session: str) -> str:
    """What the demo is about to show, on which engine, and where to read why a step went as it did."""
    name = str(engine_opts.get("name") or "")
    if name == "scripted":
        what = ("The scripted engine replays the shipped outputs of a model that solves it; the embedded model: "
                "flowstate demo.")
    elif name in ("llamacpp", "transformers") and not engine_opts.get("model"):
        what = ("On the embedded SmolLM2-135M this shows the machinery, not the answer: a 135M model cannot solve the "
                "case, but under the grammar every output parses and every rule is enforced. The method solving it: "
                "flowstate demo --engine scripted; a real model: flowstate demo --engine llamacpp --model FILE.gguf "
                "--limits standard.")
    else:
        what = ("What this model does is its own: flowstate demo --engine scripted replays a model that solves it.")
    where = (f"Why each was rejected: flowstate inspect --session {session} --db {db}, or the console (flowstate serve "
             f"--db {db}, then /ui/)." if db else "Why each was rejected: run with --db demo.db, then flowstate "
             f"inspect --session {session} --db demo.db, or open it in the console (flowstate serve --db demo.db, "
             "then /ui/).")
    return "\n".join((CASE, what, STEPS, where))


def _step_line(step: dict[str, Any]) -> str:
    parts = []
    if step["protocol_error"]:
        parts.append(f"protocol error in {step['protocol_error']['block']}")
    if step["disclosed"]:
        parts.append("disclose " + ", ".join(step["disclosed"]))
    if step["committed"]:
        parts.append(", ".join(f"{op['operation']} {op['state_id']}" for op in step["committed"]))
    if step["rejected"] or step["refused"]:
        parts.append(f"{len(step['rejected']) + len(step['refused'])} rejected")
    if step["tool_calls"]:
        parts.append("call " + ", ".join(c["name"] for c in step["tool_calls"]))
    parts.append({"final": "answer", "defer": "wait", "tools": "act", "invalid": "retry"}[step["decision"]])
    return f"  step {step['index']}: " + "; ".join(parts)


def _usage_line(record: RunRecord) -> str:
    u = record.usage
    return (
        f"request {record.request}: {len(record.steps)} steps, prompt {u.prompt_tokens} tokens "
        f"({u.cached_tokens} cached), completion {u.completion_tokens} tokens, "
        f"{u.ttft_s + u.decode_s:.2f} s in the model"
    )
