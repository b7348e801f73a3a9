"""The ``flowstate`` command line: one module per command group, on shared option groups (``options``)."""

from __future__ import annotations

import click

from engine.distribution import DISTRIBUTION
from flowstate.cli.evaluate import evaluate
from flowstate.cli.forgetting import erase, retention, vault_key
from flowstate.cli.search import search
from flowstate.cli.serve import serve
from flowstate.cli.session import demo, inspect, run
from flowstate.cli.tenants import audit, grant_role, keys, tenants
from flowstate.cli.tooling import bench, model
from flowstate.cli.transfer import export, import_


@click.group()
@click.version_option(package_name=DISTRIBUTION)
def main() -> None:
    """FlowState: execution state as memory for long-horizon LLM agents."""


for command in (run, inspect, search, export, import_, demo, serve, tenants, keys, audit, grant_role, retention, erase,
                vault_key, evaluate, model, bench):
    main.add_command(command)

__all__ = ["main", "serve"]
