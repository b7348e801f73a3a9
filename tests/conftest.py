"""Shared fixtures: a fresh repository, a builder of raw protocol outputs, a scripted agent factory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from engine.scripted import ScriptedEngine
from flowstate import Agent, LoopConfig, Repository
from tests.helpers import AgentFactory, output
from tests.pg import REQUIRE_ENV, PgServer


@pytest.fixture
def out() -> Callable[..., str]:
    return output


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def repo(db_path: Path) -> Iterable[Repository]:
    r = Repository.open(db_path)
    yield r
    r.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterable[PgServer]:
    """A PostgreSQL server for the tests, or a skip (a failure where CI requires one)."""
    try:
        server = PgServer()
    except Exception as exc:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"no PostgreSQL server: {exc}")
        pytest.skip(f"no PostgreSQL server could be started: {exc}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterable[str]:
    """A fresh database of each backend: a SQLite path, or a PostgreSQL URL of a database of its own."""
    if request.param == "sqlite":
        yield str(tmp_path / "memory.db")
        return
    server: PgServer = request.getfixturevalue("pg_server")
    url = server.new_database()
    yield url
    server.drop(url)


@pytest.fixture
def any_repo(db_target: str) -> Iterable[Repository]:
    r = Repository.open(db_target)
    yield r
    r.close()


@pytest.fixture
def make_agent(repo: Repository) -> AgentFactory:
    def factory(outputs: Iterable[str], session: str = "s1", tools: Iterable[Any] = (),
                **config: Any) -> tuple[Agent, ScriptedEngine]:
        engine = ScriptedEngine(outputs)
        agent = Agent(engine, repository=repo, session=session, tools=list(tools), config=LoopConfig(**config))
        return agent, engine

    return factory


# Modules (or single tests) whose tests run a real model (llama.cpp, transformers, MiniLM) or vLLM: one unit of work
# for xdist, so on a machine of few cores only one of them runs at a time, on one worker (two would halve each one's
# CPU and make their timeouts fire), while the other worker takes the rest.
# A new module that loads a model belongs here.
ONE_AT_A_TIME = frozenset({
    "tests/engine/test_embeddings.py", "tests/engine/test_errors.py", "tests/engine/test_llamacpp.py",
    "tests/engine/test_llamacpp_options.py", "tests/engine/test_llamacpp_threads.py",
    "tests/engine/test_transformers.py",
    "tests/engine/test_vllm.py", "tests/flowstate/eval/test_kv_measured.py", "tests/flowstate/eval/test_real_model.py",
    "tests/flowstate/eval/test_trace.py", "tests/flowstate/test_demo_embedded.py", "tests/flowstate/test_real_model.py",
    "tests/serving/test_adversarial.py", "tests/serving/test_real_model.py",
    # the pages whose Python blocks run the embedded model (an Agent on llama.cpp, LlamaCppEngine)
    *(f"tests/test_docs_commands.py::test_every_command_on_the_page_runs_as_printed[{page}]"
      for page in ("README.md", "docs/python-api.md", "docs/engines.md")),
})
MODEL = "model"  # the unit of work that holds every test of ONE_AT_A_TIME


def unit_of(nodeid: str) -> str:
    """The unit of work xdist hands one worker whole: every real model's test in one (``MODEL``), any other test
    alone (as ``--dist load`` would)."""
    return MODEL if nodeid.partition("::")[0] in ONE_AT_A_TIME or nodeid in ONE_AT_A_TIME else nodeid


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist (or with -n 0) nothing calls it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with our units (``unit_of``), whatever ``--dist`` says: the test ids decide, not a
    marker (xdist 3.8's ``xdist_group`` is lost under pytest 9.2, which no longer reads the id xdist rewrites)."""
    from xdist.scheduler import LoadScopeScheduling

    class OneModelAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return OneModelAtATime(config, log)


# Each test's time limit (pytest-timeout; setup and teardown included), by what it runs: a hung test fails with its
# traceback instead of stopping the run. A test's own ``@pytest.mark.timeout`` wins.
TIMEOUT_S = {"model": 1200, "slow": 600, "fast": 180}


def time_limit(item: pytest.Item) -> int:
    """The seconds ``item`` may take: a real model's test the most, a ``slow`` one less, the rest 3 minutes."""
    if unit_of(item.nodeid) == MODEL:
        return TIMEOUT_S["model"]
    return TIMEOUT_S["slow" if item.get_closest_marker("slow") else "fast"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test gets its time limit (``time_limit``). A test marked ``gpu`` runs only where torch sees a CUDA
    device; elsewhere it is skipped, saying so."""
    limits = config.pluginmanager.hasplugin("timeout")  # pytest-timeout, the test extra's (a bare pytest: none)
    for item in items:
        if limits and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(time_limit(item)))
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many blocks of the docs ran and how many were skipped, and why (tests/test_docs_commands.py records them
    on each page's report, which xdist carries back)."""
    reports = [r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])
               if getattr(r, "when", "") == "call" and "test_docs_commands.py" in r.nodeid]
    props = [(k, v) for r in reports for k, v in r.user_properties]
    if not props:
        return
    ran = sum(int(v) for k, v in props if k == "docs_blocks_run")
    skipped = [str(v) for k, v in props if k == "docs_skip"]
    terminalreporter.write_sep("-", f"docs: {ran} blocks run, {len(skipped)} skipped, on {len(reports)} pages")
    for line in skipped:
        terminalreporter.write_line(f"  skipped {line}")
