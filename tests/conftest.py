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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``gpu`` runs only where torch sees a CUDA device; elsewhere it is skipped, saying so."""
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
