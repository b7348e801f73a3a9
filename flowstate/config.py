"""One agent configuration: strategy, tools, the method's own tools, limits, grammar mode and task policy.

Built once (per deployment, per evaluated task), it yields what every request runs under — the system
prompt, the tool specs and the grammars (cached per request options) — for the Python API, the
endpoint, the evaluator and the benches alike, so every strategy that can be evaluated can be served.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from engine.base import Engine
from engine.priority import Priorities
from flowstate.constrain import GrammarMode, Grammars
from flowstate.limits import Limits, for_engine
from flowstate.memory.base import Strategy
from flowstate.nodes import canonical_json
from flowstate.request_options import RequestOptions
from flowstate.tools import ToolSet

GRAMMAR_CACHE = 16  # grammars kept per configuration (one per distinct client tools + request options)


@dataclass(frozen=True)
class LoopConfig:
    """Limits of one request."""

    max_steps: int = 16
    max_protocol_errors: int = 3  # consecutive unparsable outputs before the request fails
    max_repeats: int = 2  # calls refused as repeats (same tool, same arguments) before the request ends as a loop
    max_tokens: int | None = None  # per model call; None leaves it to the engine
    grammar: GrammarMode = GrammarMode.STEP  # for engines that support grammars
    limits: Limits | None = None  # protocol limits; None: the profile that fits the engine (compact for tiny models)
    on_budget: Literal["persist", "fail"] = "persist"  # at the step budget: persist as unfinished, or fail

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.max_protocol_errors < 1:
            raise ValueError("max_protocol_errors must be at least 1")
        if self.max_repeats < 0:
            raise ValueError("max_repeats must be at least 0")
        if self.on_budget not in ("persist", "fail"):
            raise ValueError(f"on_budget must be persist or fail, not {self.on_budget!r}")

    def for_engine(self, engine: Engine) -> LoopConfig:
        """This configuration with its limits resolved for ``engine``."""
        return self if self.limits is not None else replace(self, limits=for_engine(engine))


@dataclass(frozen=True)
class Wiring:
    """What one request runs under: its system prompt, every tool spec the model sees, its grammars."""

    system: str
    specs: tuple[dict[str, Any], ...]
    grammars: Grammars | None
    policy: str = ""  # the policy text the system prompt holds (the configuration's, then the request's own)


class AgentConfig:
    """An agent's configuration, resolved for one engine (its limits and whether it decodes under grammars).

    ``tools`` run in the process of the driver (the server's tools, or the evaluated task's); a request may
    add tools its client runs (``client_tools``) and a policy of its own (an endpoint client's system
    message) — they follow the configuration's own, so the system prompt's prefix stays the deployment's.
    """

    def __init__(self, engine: Engine, strategy: Strategy, *, tools: ToolSet | None = None,
                 policy: str = "", loop: LoopConfig = LoopConfig(),
                 cache_salt: Callable[[str], str | None] = lambda session: None,
                 routing: Callable[[str], str] = lambda session: session,
                 priorities: Priorities = Priorities(), lane: str = "interactive",
                 told_cached: int | None = None) -> None:
        """``cache_salt``: a session's prefix-cache partition (a server's tenant isolation; None: shared);
        ``routing``: the id a session's engine calls are routed by (a server's: keyed, never the session's name);
        ``priorities`` and ``lane``: what each call's priority is, and the kind of request run unless its options
        say otherwise (an evaluation's agent: ``evaluation``); ``told_cached``: the most cached tokens a call's
        usage may say (a server whose tenants share one cache: what everyone shares, so no tenant is told how much of
        its prompt another sent; None: what the engine says)."""
        self.strategy = strategy
        self.cache_salt, self.routing = cache_salt, routing
        priorities.of(lane)  # a lane it knows
        self.priorities, self.lane, self.told_cached = priorities, lane, told_cached
        self.tools = tools if tools is not None else ToolSet()
        self.policy = policy
        self.loop = loop.for_engine(engine)
        assert self.loop.limits is not None
        self.limits: Limits = self.loop.limits  # what the method's own states are fitted to (facts, pages)
        self.output_limits: Limits = strategy.output_limits(self.limits)  # what the model's outputs are held to
        self.constrained = engine.capabilities.grammar and self.loop.grammar is not GrammarMode.NONE
        self._grammars: OrderedDict[str, Grammars] = OrderedDict()
        self._systems: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        clash = {t["name"] for t in strategy.tools()} & set(self.tools)
        if clash:
            raise ValueError(f"tools {sorted(clash)} are the {strategy.name} memory method's own tools")

    def specs(self, client_tools: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
        """The tools the model sees: the configuration's, the client's, then the memory method's own."""
        return [*self.tools.specs(), *(dict(t) for t in client_tools), *self.strategy.tools()]

    def system_prompt(self, client_tools: Sequence[Mapping[str, Any]] = (), policy: str = "",
                      options: RequestOptions = RequestOptions()) -> str:
        """The system message of a request with these client tools, request policy and options (rendered once
        per distinct combination: every request of an agent, and most of an endpoint's, share one)."""
        key = canonical_json([list(client_tools), policy, options.answer_schema])
        with self._lock:
            system = self._systems.pop(key, None)
        if system is None:
            system = self._render_system(client_tools, policy, options)
        with self._lock:  # an endpoint's worker threads share the configuration
            self._systems[key] = system
            while len(self._systems) > GRAMMAR_CACHE:
                self._systems.popitem(last=False)
        return system

    def _policy_text(self, policy: str) -> str:
        """The policy a request runs under: the configuration's, then the request's own (an endpoint client's)."""
        return "\n\n".join(p for p in (self.policy, policy) if p) if policy.strip() else self.policy

    def _render_system(self, client_tools: Sequence[Mapping[str, Any]], policy: str, options: RequestOptions) -> str:
        text = self._policy_text(policy)
        if options.answer_schema is not None:  # the answer format the request asks for (the grammar enforces it)
            rule = ("Your final answer's content is a JSON value (not a string holding JSON) matching this JSON "
                    "Schema: " + canonical_json(options.answer_schema))
            text = f"{text}\n\n{rule}" if text.strip() else rule
        return self.strategy.system_prompt(self.specs(client_tools), text, self.output_limits)

    def grammars(self, specs: Sequence[Mapping[str, Any]], options: RequestOptions = RequestOptions(), *,
                 validate: bool = False) -> Grammars | None:
        """The grammars of requests with these tool specs and options (None where the engine decodes freely);
        ``validate``: compile once to check that client-given schemas can be decoded (``GrammarError``)."""
        if not self.constrained:
            return None
        key = canonical_json([list(specs), options.tool_choice, options.parallel_tool_calls, options.answer_schema,
                              sorted(options.hidden)])
        with self._lock:
            grammars = self._grammars.pop(key, None)
        if grammars is None:
            grammars = Grammars(specs, self.loop.grammar, self.strategy.blocks, self.output_limits, options,
                                self.strategy.optional)
        if validate:  # a cached configuration too: another caller may have cached it without validating
            grammars.validate()
        with self._lock:
            self._grammars[key] = grammars
            while len(self._grammars) > GRAMMAR_CACHE:
                self._grammars.popitem(last=False)
        return grammars

    def wiring(self, client_tools: Sequence[Mapping[str, Any]] = (), policy: str = "",
               options: RequestOptions = RequestOptions(), *, validate: bool = False) -> Wiring:
        specs = self.specs(client_tools)
        return Wiring(self.system_prompt(client_tools, policy, options), tuple(specs),
                      self.grammars(specs, options, validate=validate), self._policy_text(policy))
