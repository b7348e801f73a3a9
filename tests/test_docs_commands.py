"""Every command a page prints runs as printed: each fenced ``bash`` and ``console`` block of README.md and docs/ is
run by bash, and each ``python`` block by Python, in the page's order, in a fresh folder that sees the checkout (its
top-level entries linked in), so a page's relative paths resolve and what it writes stays out of the tree.

The pages are read by Sybil (its Markdown lexers and its ``skip`` directive); what a block is run against is this
module's. A page is one reader at one terminal: a variable a block sets (``TENANT=$(…)``) is there in the page's
later blocks, and ``$FLOWSTATE_DB`` is the folder's ``docs.db``. Engines are the scripted one
(``$FLOWSTATE_ENGINE``), whose every call answers "noted", so a page's server answers in milliseconds. ``curl``
fails on an HTTP error (``--fail-with-body``): a refused request fails its page, as it would fail its reader.

Two directives, as HTML comments a rendered page does not show, go right before the block they concern:

- ``<!-- skip: next "KIND: why" -->`` — Sybil's: the block is not run; ``<!-- skip: next if(not
  available("MODULE"), "KIND: why") -->`` skips it only where an optional part is missing (and fails where the
  environment requires it, as tests/optional.py has it). KIND is one of ``SKIPS`` (a GPU, a PostgreSQL server at a
  named host, a real model or a model server, another service the page does not start, a data file that is not
  shipped, the install or test run this very test runs inside, a run that takes minutes and is a results page's
  record); any other fails the page, so a skip is always one of these, with its reason.
- ``<!-- docs: server -->`` — each command of the next block starts a server: it is run in the background and waited
  for until it answers ``/health`` on its ``--port`` (8000 by default) or ends; all are stopped when the page ends. A
  page with servers holds a lock on port 8000 for its whole run, so two pages never serve at once.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import SkipTest

import httpx
import pytest
from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

from tests.helpers import output
from tests.optional import available

ROOT = Path(__file__).resolve().parent.parent
SKIPS = {
    "gpu": "needs a CUDA GPU",
    "postgres": "needs a PostgreSQL server at the host it names",
    "model": "needs a real model file, or a model server the page does not start",
    "server": "needs a service the page does not start: an MCP server, an OpenTelemetry collector, a remote API",
    "data": "needs a public data file the repository does not ship",
    "install": "installs into the environment, or is the test run this test is part of",
    "minutes": "a results page's recorded run, minutes long; its figures are checked by test_results_claims.py",
}
SERVER_WAIT_S = 120
LOGS = itertools.count()
BLOCK_TIMEOUT_S = 300
LOCK = Path(tempfile.gettempdir()) / "flowstate-docs-port-8000.lock"
PRELUDE = """set -euo pipefail
curl() { command curl --fail-with-body --silent --show-error "$@"; }
set -a
"""


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


@dataclass
class Reader:
    """One reader of one page: the folder they work in, the variables their blocks set, the servers they started."""

    folder: Path
    state: Path  # the shell's exported variables after the last block, as ``export -p`` writes them
    servers: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)  # (port, process)
    serve_next: bool = False
    ran: int = 0
    skipped: list[str] = field(default_factory=list)

    def stop(self, port: int | None = None) -> None:
        """Stop the servers on ``port`` (every one: None)."""
        stopping = [proc for p, proc in self.servers if port is None or p == port]
        for proc in stopping:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in stopping:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        self.servers = [(p, proc) for p, proc in self.servers if proc not in stopping]


def _reader(example: Example) -> Reader:
    reader: Reader = example.namespace["reader"]
    return reader


def commands(source: str) -> list[str]:
    """A block's commands: continuation lines joined, comment-only and blank lines left out."""
    joined = source.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def run_shell(example: Example) -> str | None:
    """A bash block (or a console block's ``$`` lines): run as printed in the reader's shell; its status decides."""
    reader = _reader(example)
    source: str = str(example.parsed)
    if example.region.lexemes.get("arguments") == "console":
        source = "\n".join(line[2:] for line in source.splitlines() if line.startswith("$ "))
    if reader.serve_next:
        reader.serve_next = False
        return _serve(reader, source)
    serving = [c for c in commands(source) if SERVES.match(c) and not re.search(r"--print-config|--help|&\s*$", c)]
    if serving:
        return f"a block that starts a server needs <!-- docs: server --> before it: {serving[0]}"
    script = reader.folder / ".block.sh"
    script.write_text(f"{PRELUDE}. {shlex.quote(str(reader.state))}\n{source}\nset +a\n"
                      f"export -p > {shlex.quote(str(reader.state))}.next\n", encoding="utf-8")
    try:
        done = subprocess.run(["bash", str(script)], cwd=reader.folder, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S, env=_env(reader))
    except subprocess.TimeoutExpired:
        return f"did not finish within {BLOCK_TIMEOUT_S} s:\n{source}"
    if done.returncode != 0:
        return (f"exit {done.returncode}:\n{source}\n--- stdout\n{done.stdout[-3000:]}\n"
                f"--- stderr\n{done.stderr[-3000:]}")
    Path(f"{reader.state}.next").replace(reader.state)
    reader.ran += 1
    return None


def run_python(example: Example) -> str | None:
    """A python block: run by a fresh interpreter in the reader's folder, with the reader's variables."""
    reader = _reader(example)
    try:
        done = subprocess.run([sys.executable, "-c", str(example.parsed)], cwd=reader.folder, capture_output=True,
                              text=True, timeout=BLOCK_TIMEOUT_S, env=_env(reader))
    except subprocess.TimeoutExpired:
        return f"did not finish within {BLOCK_TIMEOUT_S} s:\n{example.parsed}"
    if done.returncode != 0:
        return f"exit {done.returncode}:\n{example.parsed}\n--- stderr\n{done.stderr[-3000:]}"
    reader.ran += 1
    return None


def _env(reader: Reader) -> dict[str, str]:
    """The reader's variables: what their blocks exported, read back from the shell's own listing."""
    listing = subprocess.run(["bash", "-c", f". {shlex.quote(str(reader.state))}; env -0"], capture_output=True,
                             check=True, env={"PATH": os.environ.get("PATH", "")}, timeout=30).stdout
    return dict(item.split("=", 1) for item in listing.decode().split("\0") if "=" in item)


PORT = re.compile(r"--port[ =](\d+)")
SERVES = re.compile(r"^\s*(?:[A-Z_]+=\S+\s+)*flowstate serve\b")


def _serve(reader: Reader, source: str) -> str | None:
    """Each command starts a server: wait until it answers /health on its port, or ends (as --print-config does)."""
    for command in commands(source):
        match = PORT.search(command)
        port = int(match.group(1)) if match else 8000
        reader.stop(port)  # a reader stops the server they started on that port before starting another
        log = reader.folder / f".server{next(LOGS)}.log"
        proc = subprocess.Popen(["bash", "-c", f"{PRELUDE}. {shlex.quote(str(reader.state))}\nexec {command}"],
                                cwd=reader.folder, env=_env(reader), stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        reader.servers.append((port, proc))
        deadline = time.monotonic() + SERVER_WAIT_S
        while True:
            if proc.poll() is not None:
                if proc.returncode != 0:
                    return f"the server exited {proc.returncode}:\n{command}\n{log.read_text()[-3000:]}"
                break
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                return f"no answer on port {port} within {SERVER_WAIT_S} s:\n{command}\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
    reader.ran += 1
    return None


def _mark_server(example: Example) -> None:
    directive = str(example.parsed).strip()
    if directive != "server":
        raise ValueError(f"unknown docs directive {directive!r} (known: server)")
    _reader(example).serve_next = True


class DocsDirectiveParser:
    """``<!-- docs: server -->``: the next block starts servers."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="docs", arguments=r"\w+")

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.lexer(document):
            yield Region(region.start, region.end, region.lexemes["arguments"], _mark_server)


DOCS = Sybil(parsers=[CodeBlockParser("bash", run_shell), CodeBlockParser("console", run_shell),
                      CodeBlockParser("python", run_python), SkipParser(), DocsDirectiveParser()],
             patterns=["*.md"])

ANSWER = output(content="noted")


def _folder(tmp: Path) -> Path:
    """A fresh folder that sees the checkout: each top-level entry linked in (README.md, docs/, tests/, …)."""
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".venv"} and not entry.name.startswith(".ci-"):
            (tmp / entry.name).symlink_to(entry)
    return tmp


def read_page(page: Path, tmp: Path) -> Reader:
    """Run every block of one page in order; the reader's tally of what ran and what was skipped, and why."""
    folder = _folder(tmp)
    script = folder / ".answers.jsonl"
    script.write_text("".join(json.dumps({"text": ANSWER}) + "\n" for _ in range(500)), encoding="utf-8")
    state = folder / ".env.sh"
    base = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLOWSTATE_DB": str(folder / "docs.db"), "FLOWSTATE_ENGINE": f"scripted,script={script}",
            "FLOWSTATE_API_KEYS": "", "FLOWSTATE_ADMIN_KEYS": "", "HOME": str(folder)}
    state.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in base.items()
                             if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)), encoding="utf-8")
    document = DOCS.parse(page)
    reader = Reader(folder, state)
    document.namespace.update(reader=reader, available=available)  # a skip may be ``if(not available(…), …)``
    serving = "<!-- docs: server -->" in document.text
    lock = LOCK.open("w") if serving else None
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        for example in document.examples():
            try:
                example.evaluate()
            except SkipTest as why:
                kind = str(why).split(":", 1)[0]
                assert kind in SKIPS, f"{page.name}:{example.line}: a skip must say why, one of {sorted(SKIPS)}: {why}"
                reader.skipped.append(f"{shown(page)}:{example.line}: {why}")
    finally:
        reader.stop()
        if lock is not None:
            lock.close()
    return reader


@pytest.mark.slow
@pytest.mark.parametrize("page", pages(), ids=[shown(p) for p in pages()])
def test_every_command_on_the_page_runs_as_printed(page: Path, tmp_path: Path,
                                                   record_property: Any) -> None:
    reader = read_page(page, tmp_path)
    record_property("docs_blocks_run", reader.ran)
    record_property("docs_blocks_skipped", len(reader.skipped))
    for line in reader.skipped:
        record_property("docs_skip", line)


def test_a_broken_command_fails_its_page(tmp_path: Path) -> None:
    """The harness itself: a command that fails, a curl refused by a server, an unexplained skip, and a skip with its
    reason — on a page written here."""
    docs = tmp_path / "docs"
    docs.mkdir()
    cases = {
        "fails.md": "```bash\ntrue\nflowstate tenants list --nope\n```\n",
        "refused.md": "<!-- docs: server -->\n```bash\nflowstate serve --port {port}\n```\n\n"
                      "```bash\ncurl localhost:{port}/v1/admin/tenants -d '{{\"name\": \"x\"}}'\n```\n",
        "unexplained.md": "<!-- skip: next \"because\" -->\n```bash\nfalse\n```\n",
        "python.md": "```python\nraise SystemExit(3)\n```\n",
    }
    from tests.serving.conftest import free_port

    port = free_port()
    for name, text in cases.items():
        (docs / name).write_text(text.format(port=port), encoding="utf-8")
        work = tmp_path / name.removesuffix(".md")
        work.mkdir()
        with pytest.raises(AssertionError) as failed:
            read_page(docs / name, work)
        assert ("exit" in str(failed.value) or "skip must say why" in str(failed.value)), str(failed.value)
    (docs / "fine.md").write_text("```bash\nX=$(echo 4)\n```\n\n<!-- skip: next \"gpu: a 9B model\" -->\n"
                                  "```bash\nfalse\n```\n\n```bash\ntest \"$X\" = 4\n```\n", encoding="utf-8")
    (tmp_path / "fine").mkdir()
    reader = read_page(docs / "fine.md", tmp_path / "fine")
    assert reader.ran == 2 and len(reader.skipped) == 1 and reader.skipped[0].endswith("gpu: a 9B model")
