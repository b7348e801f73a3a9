"""The built-in suites, each generated from a seed with a chosen number of tasks and depth.

The small suites (hotel, bundle, travel, chain) return tool results of a few dozen tokens: fast, but
not the regime where memory saves tokens. The realistic suites (shopping, planning, reasoning)
return pages and tables the size of the benchmarks the paper measured; their sizes are options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.base import Engine
from flowstate.eval.suites import bundle, chain, hotel, planning, reasoning, shopping, travel
from flowstate.eval.task import Task
from flowstate.limits import Limits
from flowstate.memory.base import Strategy

if TYPE_CHECKING:
    from flowstate.eval.policies import Answerer

SMALL = ("hotel", "bundle", "travel", "chain")
REALISTIC = ("shopping", "planning", "reasoning")
TAU3 = ("tau3-airline", "tau3-retail")  # τ³-bench's domains, read from its data (flowstate.eval.tau3)
REPLAY = "tau-replay"  # recorded τ-bench conversations replayed (flowstate.eval.replay), from --data FILE
ARENA = "memoryarena"  # MemoryArena's formal reasoning data (flowstate.eval.memoryarena), from --data FILE
SESSIONS = "sessions"  # your own stored sessions replayed (flowstate.eval.stored), from --from DB_URL|EXPORT_FILE
POLICIES = ("oracle", "realistic", "memoryless")
"""The reference policies: the optimistic bound, a realistic one, the memoryless bound (``flowstate.eval.policies``)."""


@dataclass(frozen=True)
class Spec:
    """What a run asks of a suite besides how many tasks: their depth and seed, size options, and where data comes
    from (τ³'s data folder and trials, a recording or dataset file, a judge)."""

    depth: int
    seed: int = 0
    sizes: Mapping[str, int] = field(default_factory=dict)  # only the suite's own options
    data_dir: str | None = None
    trials: int = 1
    data: str | None = None
    judge: Engine | None = None
    select: Any = None  # the sessions suite: which stored sessions (flowstate.eval.stored.Selection)


@dataclass(frozen=True)
class Rules:
    """How a suite's tasks run: under which ``--policy`` values (None: a model plays them), why it refuses the
    others, whether its tools may come from MCP servers (``--mcp``), whether each task is a conversation with a
    user rather than a list of subtask queries, and whether it plays under its reference policy whatever the
    engine (a recording replays itself); and how its quality is reported: with sPS (a subtask's share of its
    constraints met) and PS over all subtasks rather than averaged per task (the paper's Travel figures)."""

    policies: tuple[str | None, ...] = (None, *POLICIES)
    refusal: str = ""  # why a policy not in ``policies`` is refused ({policy} names it)
    mcp: bool = False
    conversational: bool = False
    replayed: bool = False
    soft: bool = False
    micro_ps: bool = False


def suite_policy(task: Task, strategy: Strategy, limits: Limits, bound: str | None) -> Answerer:
    """The generated suites' reference policy, at the bound ``--policy`` names (oracle by default)."""
    from flowstate.eval.policies import Policy

    return Policy(task, strategy, memory=bound != "memoryless", limits=limits, realistic=bound == "realistic")


class Suite(Protocol):
    """A suite: its name, the size options it takes (with their defaults), the rules its runs follow, its tasks
    for a run, and the reference policy that plays one of them at a bound."""

    @property
    def name(self) -> str: ...

    @property
    def options(self) -> Mapping[str, int]: ...

    @property
    def rules(self) -> Rules: ...

    def tasks(self, n: int, spec: Spec) -> list[Task]: ...

    def reference(self, task: Task, strategy: Strategy, limits: Limits, bound: str | None) -> Answerer: ...


@dataclass(frozen=True)
class Generated:
    """A suite generated from a seed: ``n`` tasks of ``depth`` subtasks, the same for the same spec."""

    name: str
    make: Callable[..., list[Task]]
    options: Mapping[str, int] = field(default_factory=dict)
    rules: Rules = Rules()

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        if n < 1 or spec.depth < 1:
            raise ValueError("tasks and depth must be at least 1")
        return self.make(n, spec.depth, spec.seed, **spec.sizes)

    reference = staticmethod(suite_policy)


@dataclass(frozen=True)
class Tau3:
    """A τ³-bench domain: its first ``n`` tasks, each ``trials`` times, from its data."""

    name: str
    options: Mapping[str, int] = field(default_factory=dict)
    rules: Rules = Rules(policies=(None, "oracle"), mcp=True, conversational=True,
                         refusal="the τ³ suites replay their gold actions (--policy oracle), not a {policy} policy")

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        from flowstate.eval.tau3.tasks import generate as tau3_tasks

        return tau3_tasks(self.name, n, spec.data_dir, spec.trials)

    @staticmethod
    def reference(task: Task, strategy: Strategy, limits: Limits, bound: str | None) -> Answerer:
        """Its gold actions."""
        from flowstate.eval.tau3.gold import GoldPolicy
        from flowstate.eval.tau3.tasks import Tau3Task

        if not isinstance(task, Tau3Task):
            raise TypeError(f"a τ³ suite's reference plays τ³ tasks, not {type(task).__name__}")
        return GoldPolicy(task, strategy, limits)


@dataclass(frozen=True)
class Replay:
    """Recorded τ-bench conversations, replayed (``--data FILE``)."""

    name: str = REPLAY
    rules: Rules = Rules(policies=("realistic",), replayed=True,
                         refusal="tau-replay replays its recordings through each strategy (no model) with a realistic "
                                 "memory policy: give --policy realistic")

    @property
    def options(self) -> Mapping[str, int]:
        from flowstate.eval.replay import OPTIONS

        return OPTIONS

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        from flowstate.eval.replay import generate as replay_tasks

        return replay_tasks(spec.data, n, **spec.sizes)

    @staticmethod
    def reference(task: Task, strategy: Strategy, limits: Limits, bound: str | None) -> Answerer:
        """The recording's own calls, with realistic memory work."""
        from flowstate.eval.replay import ReplayPolicy, ReplayTask

        if not isinstance(task, ReplayTask):
            raise TypeError(f"tau-replay's reference plays recorded conversations, not {type(task).__name__}")
        return ReplayPolicy(task, strategy, limits)


@dataclass(frozen=True)
class Arena:
    """MemoryArena's formal reasoning data (``--data FILE``), graded by the judge where one is given."""

    name: str = ARENA
    options: Mapping[str, int] = field(default_factory=dict)
    rules: Rules = Rules()

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        from flowstate.eval.memoryarena import read

        return list(read(spec.data, n, spec.judge))

    reference = staticmethod(suite_policy)


@dataclass(frozen=True)
class Stored:
    """Your own stored sessions (``--from DB_URL|EXPORT_FILE``), replayed under a model — or, with ``--policy
    realistic``, under their own recorded calls and answers (what checks the replay itself)."""

    name: str = SESSIONS
    options: Mapping[str, int] = field(default_factory=dict)
    rules: Rules = Rules(policies=(None, "realistic"),
                         refusal="the sessions suite replays stored sessions under a model, or their own recorded "
                                 "calls with --policy realistic, not a {policy} policy")

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        from flowstate.eval.stored import Selection, generate

        return list(generate(spec.data, n, spec.select or Selection(), spec.judge))

    @staticmethod
    def reference(task: Task, strategy: Strategy, limits: Limits, bound: str | None) -> Answerer:
        """The session's own recorded calls and answers, with realistic memory work (tau-replay's policy)."""
        from flowstate.eval.replay import ReplayPolicy
        from flowstate.eval.stored import StoredTask

        if not isinstance(task, StoredTask):
            raise TypeError(f"the sessions suite's reference plays stored sessions, not {type(task).__name__}")
        return ReplayPolicy(task, strategy, limits)


SCORED_BY_CONSTRAINT = Rules(soft=True, micro_ps=True)  # travel and planning: credit per constraint met

REGISTRY: dict[str, Suite] = {
    "hotel": Generated("hotel", hotel.generate), "bundle": Generated("bundle", bundle.generate),
    "travel": Generated("travel", travel.generate, rules=SCORED_BY_CONSTRAINT),
    "chain": Generated("chain", chain.generate),
    "shopping": Generated("shopping", shopping.generate, shopping.OPTIONS),
    "planning": Generated("planning", planning.generate, planning.OPTIONS, SCORED_BY_CONSTRAINT),
    "reasoning": Generated("reasoning", reasoning.generate, reasoning.OPTIONS),
    **{name: Tau3(name) for name in TAU3}, REPLAY: Replay(), ARENA: Arena(), SESSIONS: Stored(),
}
"""Every suite by name: one protocol, whether generated, read from τ³'s data, replayed or a dataset."""
SUITES = (*SMALL, *REALISTIC)  # the generated suites
ALL = tuple(REGISTRY)


def suite(name: str) -> Suite:
    """The suite called ``name`` (unknown names list the valid ones)."""
    found = REGISTRY.get(name)
    if found is None:
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(ALL)}")
    return found


def options(name: str) -> dict[str, int]:
    """The size options a suite takes, with their defaults."""
    return dict(suite(name).options)


def check_run(names: Sequence[str], policy: str | None, mcp: bool) -> None:
    """The suites' rules hold for a run under ``policy`` (None: a model) with (``mcp``) or without MCP tools."""
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"unknown reference policy {policy!r}; valid: {', '.join(POLICIES)}")
    for name in names:
        rules = suite(name).rules
        if policy not in rules.policies:
            raise ValueError(rules.refusal.format(policy=policy))
    cannot = [name for name in names if not suite(name).rules.mcp]
    if mcp and cannot:
        takers = ", ".join(name for name in ALL if suite(name).rules.mcp)
        raise ValueError(f"--mcp gives a suite's own tools from MCP servers (graded against the domain's own tools: "
                         f"{takers}); {', '.join(cannot)} cannot take them")


def check_options(suites: Any, given: Mapping[str, int]) -> None:
    """Every option given is taken by at least one of the suites."""
    known = {name for s in suites for name in options(s)}
    unknown = sorted(set(given) - known)
    if unknown:
        valid = ", ".join(sorted(known)) or "none"
        raise ValueError(f"unknown suite option(s) {', '.join(unknown)} for suites {', '.join(suites)}; valid: {valid}")


def generate(name: str, tasks: int, spec: Spec | int) -> list[Task]:
    """``tasks`` task instances as ``spec`` asks (a bare int: that depth, seed 0); the same arguments give the same
    tasks.

    ``spec.sizes`` sets observation sizes; each suite takes the ones it knows (``options``). The τ³ suites read
    their data (``spec.data_dir``: a tau2-bench checkout's data folder) and run each task ``spec.trials`` times;
    ``tau-replay`` reads its recorded conversations from ``spec.data``, ``memoryarena`` its JSON Lines from it too
    (graded by ``spec.judge`` where one is given).
    """
    chosen = suite(name)
    spec = Spec(spec) if isinstance(spec, int) else spec
    taken = {k: v for k, v in spec.sizes.items() if k in chosen.options}
    if any(v < 1 for v in taken.values()):
        raise ValueError("suite options must be at least 1")
    return chosen.tasks(tasks, dataclasses.replace(spec, sizes=taken))
