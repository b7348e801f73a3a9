"""The Python API: an agent = engine + tools + repository + session; ``run(query)`` is one request."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.base import Engine
from flowstate.constrain import GrammarMode, Grammars
from flowstate.loop import LoopConfig, run_request
from flowstate.records import RunRecord
from flowstate.repository import Repository
from flowstate.strategies import FLOWSTATE, Strategy
from flowstate.tools import Tool, ToolSet


class Agent:
    """A FlowState agent bound to one session of a repository.

    Without an engine it runs on the embedded default (``llamacpp`` with SmolLM2-135M-Instruct).
    ``config.limits`` sets the protocol limits (``flowstate.limits``); left None, the engine decides:
    compact for the embedded tiny model, standard for every other.

    >>> agent = Agent(engine, repository=Repository.open("memory.db"), session="alice", tools=[search])
    >>> agent.run("Book hotel A").response
    """

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        repository: Repository,
        session: str,
        tools: ToolSet | Iterable[Tool | Callable[..., Any]] = (),
        task_policy: str = "",
        config: LoopConfig = LoopConfig(),
        strategy: Strategy = FLOWSTATE,
    ) -> None:
        if not session:
            raise ValueError("the session name is empty")
        if engine is None:
            import engine as engines  # the embedded default (llama.cpp + SmolLM2), loaded on demand

            engine = engines.load(engines.DEFAULT)
        self.engine = engine
        self.repository = repository
        self.session = session
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.config = config = config.for_engine(engine)
        assert config.limits is not None
        self.limits = config.limits
        self.strategy = strategy
        specs = [*self.tools.specs(), *strategy.tools()]  # the task's tools and the memory method's own
        self.system = strategy.system_prompt(specs, task_policy, self.limits)
        self.grammars = (
            Grammars(specs, config.grammar, strategy.blocks, self.limits)
            if engine.supports_grammar and config.grammar is not GrammarMode.NONE else None
        )

    def run(self, query: str) -> RunRecord:
        """Execute one request (the session's next) and persist it; raises ``RequestFailed`` on failure."""
        return run_request(
            engine=self.engine, repo=self.repository, session=self.session, query=query,
            system=self.system, tools=self.tools, config=self.config, grammars=self.grammars, strategy=self.strategy,
        )
