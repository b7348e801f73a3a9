"""The Python API: an agent = engine + tools + repository + session; ``run(query)`` is one request."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.base import Engine
from flowstate.config import AgentConfig, LoopConfig
from flowstate.loop import run_request
from flowstate.memory.base import Strategy
from flowstate.memory.state import FLOWSTATE
from flowstate.records import RunRecord
from flowstate.store.repository import Repository
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
        lane: str = "interactive",
    ) -> None:
        """``lane``: what its requests are run for — interactive, background or evaluation — which orders its engine
        calls among others' where the engine schedules by priority (engine.priority)."""
        if not session:
            raise ValueError("the session name is empty")
        if engine is None:
            import engine as engines  # the embedded default (llama.cpp + SmolLM2), loaded on demand

            engine = engines.load(engines.DEFAULT)
        self.engine = engine
        self.repository = repository
        self.session = session
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        if repository.redaction is not None and self.tools.restore is None:  # the tools get what placeholders stand for
            self.tools.restore = repository.redaction.restore
        self.strategy = strategy
        self.setup = AgentConfig(engine, strategy=strategy, tools=self.tools, policy=task_policy, loop=config,
                                 lane=lane)
        self.loop = self.setup.loop  # the loop's settings (``config``)
        self.limits = self.setup.limits
        self.system = self.setup.system_prompt()

    def run(self, query: str) -> RunRecord:
        """Execute one request (the session's next) and persist it; raises ``RequestFailed`` on failure."""
        return run_request(engine=self.engine, repo=self.repository, session=self.session, query=query,
                           agent=self.setup)
