"""``flowstate model`` and ``flowstate bench``: exporting the embedded model, and the benchmarks that print figures."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import click

import engine as engines
from flowstate.cli.options import engine_options, errors, loop_config, loop_options


@click.group()
def model() -> None:
    """Manage the embedded model."""


@model.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", "source", default=None, help="Local HF folder or .gguf [default: embedded SmolLM2-135M-Instruct].")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float32", "float16"]))
def export(directory: Path, source: str | None, dtype: str) -> None:
    """Write the model as a transformers folder that vLLM (and vllm serve) can load."""
    with errors():
        from engine.transformers import export_model

        click.echo(export_model(directory, source, dtype))


@click.group()
def bench() -> None:
    """Benchmarks that print figures."""


@bench.command("decode")
@engine_options
@click.option("--calls", default=None, type=click.IntRange(min=1), help="Use only the first N of the 8 hotel-case prompts.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON.")
def bench_decode_cmd(calls: int | None, out: Path | None, **engine_opts: Any) -> None:
    """Tokens/s without grammar vs static vs per-step grammar, per engine (--engine a,b: side by side in one run)."""
    from flowstate.bench.decode import bench_decode, render_table

    with errors():
        max_tokens = engine_opts.pop("max_tokens")
        names = [n.strip() for n in engine_opts.pop("name").split(",") if n.strip()]
        loaded = {n: engines.load(n, **engine_opts, max_tokens=None) for n in names}
        rows = bench_decode(loaded, calls=calls, max_tokens=max_tokens, progress=lambda line: click.echo(line, err=True))
        click.echo(render_table(rows))
        if out is not None:
            out.write_text(json.dumps({"engines": names, "rows": rows}, indent=2))


@bench.command("serve")
@engine_options
@click.option("--sessions", default="8,32", show_default=True, help="Concurrent sessions, comma-separated.")
@loop_options(max_steps=2)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON.")
def bench_serve_cmd(
    sessions: str, max_steps: int, max_protocol_errors: int, limits_name: str, on_budget: str, out: Path | None,
    grammar_mode: str, **engine_opts: Any,
) -> None:
    """Output tok/s of N concurrent sessions through flowstate serve vs the same calls sent to the engine directly."""
    from serving.bench import bench_serve, render_table

    with errors():
        counts = [int(x) for x in sessions.split(",") if x.strip()]
        model = engines.load(**engine_opts)
        loop = loop_config(model, max_steps=max_steps, max_protocol_errors=max_protocol_errors, limits_name=limits_name,
                           on_budget=on_budget, grammar_mode=grammar_mode)
        try:
            rows = bench_serve(model, counts, loop, progress=lambda line: click.echo(line, err=True))
        finally:
            model.close()
        click.echo(render_table(rows))
        if out is not None:
            out.write_text(json.dumps({"engine": engine_opts["name"], "rows": rows}, indent=2))


@bench.command("contracts")
@engine_options
@click.option("--tries", default=10, show_default=True, type=click.IntRange(min=1), help="Requests of each kind.")
@loop_options(max_steps=3)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON.")
def bench_contracts_cmd(
    tries: int, max_steps: int, max_protocol_errors: int, limits_name: str, on_budget: str, out: Path | None,
    grammar_mode: str, **engine_opts: Any,
) -> None:
    """Whether replies keep what requests promise (JSON answer, named or required tool call) at a tight step budget."""
    from serving.contracts import bench_contracts, render_table

    with errors():
        model = engines.load(**engine_opts)
        loop = loop_config(model, max_steps=max_steps, max_protocol_errors=max_protocol_errors, limits_name=limits_name,
                           on_budget=on_budget, grammar_mode=grammar_mode, max_tokens=engine_opts.get("max_tokens"))
        try:
            rows = bench_contracts(model, tries, loop, progress=lambda line: click.echo(line, err=True))
        finally:
            model.close()
        click.echo(render_table(rows))
        if out is not None:
            out.write_text(json.dumps({"engine": engine_opts["name"], "rows": rows}, indent=2))


@bench.command("repo")
@click.option("--sizes", default="10000,100000,1000000", show_default=True, help="Nodes, comma-separated.")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL server (URL of a database whose user may create databases): each size gets a "
                   "fresh database there [default: $FLOWSTATE_BENCH_PG; without one, SQLite only].")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(min=10), help="Disclosures timed per size.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON.")
def bench_repo_cmd(sizes: str, pg_url: str | None, samples: int, out: Path | None) -> None:
    """Persist rate, disclose latency (p50/p99) and index build time by size, SQLite and PostgreSQL side by side."""
    from flowstate.bench.repo import Databases, bench_repo, render_table

    with errors(), tempfile.TemporaryDirectory() as tmp:
        counts = [int(x) for x in sizes.split(",") if x.strip()]
        databases = Databases(tmp, pg_url)
        try:
            rows = bench_repo(databases.targets(), counts, samples, progress=lambda line: click.echo(line, err=True))
        finally:
            databases.close()
        click.echo(render_table(rows))
        if out is not None:
            out.write_text(json.dumps({"rows": rows}, indent=2))
