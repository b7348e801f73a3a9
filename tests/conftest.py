"""Shared fixtures: a fresh repository, a builder of raw protocol outputs, a scripted agent factory."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from engine.scripted import ScriptedEngine
from flowstate import Agent, LoopConfig, Repository
from tests.helpers import AgentFactory, output


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



@pytest.fixture
def make_agent(repo: Repository) -> AgentFactory:
    def factory(outputs: Iterable[str], session: str = "s1", tools: Iterable[Any] = (), **config: Any) -> tuple[Agent, ScriptedEngine]:
        engine = ScriptedEngine(outputs)
        agent = Agent(engine, repository=repo, session=session, tools=list(tools), config=LoopConfig(**config))
        return agent, engine

    return factory
