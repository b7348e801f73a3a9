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
    def factory(outputs: Iterable[str], session: str = "s1", tools: Iterable[Any] = (), **config: Any) -> tuple[Agent, ScriptedEngine]:
        engine = ScriptedEngine(outputs)
        agent = Agent(engine, repository=repo, session=session, tools=list(tools), config=LoopConfig(**config))
        return agent, engine

    return factory


# Modules whose tests run a real model (llama.cpp, transformers, MiniLM) or vLLM: one xdist group, so on a machine
# of few cores only one of them runs at a time (two would halve each one's CPU and make their timeouts fire), while
# the other worker takes the rest. A new module that loads a model belongs here.
ONE_AT_A_TIME = frozenset({
    "tests/engine/test_embeddings.py", "tests/engine/test_errors.py", "tests/engine/test_llamacpp.py", "tests/engine/test_llamacpp_options.py",
    "tests/engine/test_llamacpp_threads.py", "tests/engine/test_transformers.py", "tests/engine/test_vllm.py",
    "tests/flowstate/eval/test_kv_measured.py", "tests/flowstate/eval/test_real_model.py",
    "tests/flowstate/eval/test_trace.py", "tests/flowstate/test_demo_embedded.py", "tests/flowstate/test_real_model.py",
    "tests/serving/test_adversarial.py", "tests/serving/test_real_model.py", "tests/test_readme.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A real model's tests share one worker (``ONE_AT_A_TIME``). A test marked ``gpu`` runs only where torch sees a
    CUDA device; elsewhere it is skipped, saying so."""
    root = Path(__file__).resolve().parent.parent
    for item in items:
        if item.path.resolve().relative_to(root).as_posix() in ONE_AT_A_TIME:
            item.add_marker(pytest.mark.xdist_group("model"))
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
