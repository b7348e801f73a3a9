"""Run every (suite, strategy) pair on the same tasks, N tasks in flight, resumably.

Each finished task is one JSON line in ``results.jsonl`` (appended and fsynced), so a killed run
loses only its unfinished tasks; a rerun with the same ``--out`` skips what is done and redoes the
rest from a clean session (their partial requests are deleted first).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.base import Engine
from engine.embeddings import Embedder
from engine.text import tokenize
from flowstate.agent import Agent
from flowstate.config import LoopConfig
from flowstate.eval.episode import request_outcome
from flowstate.eval.policies import PolicyEngine
from flowstate.eval.rows import SubtaskRow, TaskRow
from flowstate.eval.suites import SESSIONS, Spec, check_options, check_run, generate
from flowstate.eval.suites import suite as suite_named
from flowstate.eval.task import Task
from flowstate.eval.tau3.conversation import Conversation, run_conversation
from flowstate.eval.tau3.users import tau2_guidelines
from flowstate.eval.trace import RecordingEngine, TraceWriter
from flowstate.limits import STANDARD
from flowstate.mcp import connect
from flowstate.memory import embedded, get
from flowstate.memory.base import Strategy
from flowstate.store.repository import Repository
from flowstate.tools import ToolSet


@dataclass(frozen=True)
class EvalConfig:
    suites: tuple[str, ...]
    strategies: tuple[str, ...]
    tasks: int
    depth: int
    out: Path
    seed: int = 0
    concurrency: int = 1
    loop: LoopConfig = field(default_factory=LoopConfig)
    engine: str = ""  # a label of the engine (name and model), recorded so a resumed run stays comparable
    policy: str | None = None  # a reference policy instead of a model: "oracle", "realistic" or "memoryless"
    sizes: dict[str, int] = field(default_factory=dict)  # observation sizes of the realistic suites
    tau2_data: str | None = None  # τ³ suites: a tau2-bench checkout's data folder (else the packaged airline data)
    trials: int = 1  # τ³ suites: runs of each task (pass^k)
    user: str = ""  # τ³ suites: a label of the user simulator's engine ("" = the scripted user)
    judge: str = ""  # τ³ suites: a label of the judge engine of NL assertions ("" = none)
    embed: str = ""  # a label of the embedder the methods whose sources embed rank by ("" = BM25 stands in)
    db: str | None = None  # the memory: a path or postgresql:// URL shared by several runs (default: out/memory.db)
    # reference policies: tokens as words and punctuation, "embedded" (SmolLM2's), or a .gguf's
    count_tokens: str = "words"
    # the engine settings that change outputs (preset, sampling…)
    decoding: dict[str, Any] = field(default_factory=dict)
    kv_model: str = "qwen3.5-9b"  # the report's KV-cache footprint: a shipped configuration or a config.json
    gpu_memory_gib: float = 80.0  # ... and the GPU memory its sessions share with the weights
    # the report's prefill-equivalent tokens: MODEL@GPU:BATCH (flowstate.eval.gpu)
    gpu_cost: str = "qwen3.5-27b@h200:32"
    decode_weight: float | None = None  # ... with this decode weight instead of the roofline's
    replay: str | None = None  # --data: tau-replay's recorded τ-bench conversations, memoryarena's JSON Lines
    trace: str | None = None  # a file that every model call is recorded into, to replay on a server (not identity)
    mcp: tuple[str, ...] = ()  # τ³ suites: MCP servers (NAME=COMMAND|URL) whose tools replace the domain's own
    mcp_scope: str = "server"  # ... one server for every task, or one per task's session
    mcp_timeout: float = 60.0  # ... seconds a tool call may take (not identity)
    mcp_sessions: int = 64  # ... per-session servers live at once (not identity)
    # kinds redacted before anything is stored (flowstate/store/redaction.py), as serve does
    redact: tuple[str, ...] = ()
    # the sessions suite: which stored sessions (Selection's fields)
    select: dict[str, Any] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        """Session names' prefix: a run's folder name where the database is shared with other runs."""
        return f"{self.out.name}/" if self.db else ""

    def identity(self) -> dict[str, Any]:
        """What must not change between a run and its resumption: every setting that changes results."""
        return {"depth": self.depth, "seed": self.seed, "engine": self.engine, "policy": self.policy,
                "loop": loop_dict(self.loop),
                "decoding": {k: v for k, v in sorted(self.decoding.items()) if v is not None},
                **({"sizes": self.sizes} if self.sizes else {}),
                **({"replay": source_label(self.replay)} if self.replay else {}),
                **({"select": self.select} if self.select else {}),
                **({"tau2_data": str(Path(self.tau2_data).resolve())} if self.tau2_data else {}),
                **({"count_tokens": self.count_tokens} if self.count_tokens != "words" else {}),
                **({"trials": self.trials, "user": self.user, "judge": self.judge} if self.trials != 1 or self.user
                   or self.judge else {}),
                **({"mcp": list(self.mcp), "mcp_scope": self.mcp_scope} if self.mcp else {}),
                **({"embed": self.embed} if self.embed else {}),
                **({"redact": list(self.redact)} if self.redact else {})}


class Results:
    """``results.jsonl``: one line per finished task; appends are serialized and fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        if path.exists() and path.stat().st_size:
            with path.open("rb+") as f:  # a line cut by a crash: end it, so the next row starts on its own line
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")

    def rows(self) -> list[TaskRow]:
        """The rows of every finished task, as whichever run wrote them (``TaskRow.from_dict`` reads older ones)."""
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(TaskRow.from_dict(json.loads(line)))
            except json.JSONDecodeError:  # a line cut by a crash mid-write: that task is redone
                continue
        return rows

    def append(self, row: TaskRow) -> None:
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row.to_dict(), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


def conversation_row(talk: Conversation, run: str) -> TaskRow:
    """A τ³ conversation's row: each of its turns a subtask, all graded by the conversation's reward."""
    subtasks = tuple(SubtaskRow.of(t.k, t.response, t.steps, talk.success, float(talk.success), t.error,
                                   t.memory_calls) for t in talk.turns)
    return TaskRow(talk.task.suite, talk.strategy, talk.task.id, len(subtasks), run, talk.started, talk.ended,
                   talk.success, subtasks, talk.task.base, talk.task.trial, talk.tau3)


def run_task(task: Task, strategy: Strategy, engine: Engine, repo: Repository, loop: LoopConfig, run: str,
             namespace: str = "") -> TaskRow:
    """One task: its subtasks as consecutive requests of a fresh session, each graded when it ends."""
    session = f"{namespace}{task.suite}/{strategy.name}/{task.id}"
    repo.delete_session(session)  # what a killed run left of this task
    env = task.new_env()
    agent = Agent(engine, repository=repo, session=session, tools=task.tools(env), task_policy=task.policy,
                  config=loop, strategy=strategy, lane="evaluation")
    started = time.time()
    subtasks, scores = [], []
    for k, query in enumerate(task.queries, start=1):
        env["day"] = k
        out = request_outcome(agent, query)
        score = task.check(k, out.response, env)
        scores.append(score)
        subtasks.append(SubtaskRow.of(k, out.response, out.steps, score.correct, score.credit, out.error,
                                      out.memory_calls, score.detail))
    return TaskRow(task.suite, strategy.name, task.id, task.depth, run, started, time.time(), task.success(scores),
                   tuple(subtasks))


# told a line at each step of the run (``flowstate.loop.Progress`` is a request's state)
OnProgress = Callable[[str], None]


def run_eval(config: EvalConfig, engines: Sequence[Engine], progress: OnProgress = lambda _: None,
             user: Engine | None = None, judge: Engine | None = None,
             embedder: Embedder | None = None) -> list[TaskRow]:
    """Run what ``results.jsonl`` does not hold yet; return the rows of this configuration.

    ``user`` and ``judge``: the τ³ suites' user simulator and NL-assertion judge engines (None: the
    scripted user; no judge); ``embedder``: what the methods whose sources embed rank by (None: BM25).
    """
    strategies = [embedded(get(name), embedder) for name in config.strategies]
    check_options(config.suites, config.sizes)
    check_count(config.count_tokens)
    check_run(config.suites, config.policy, bool(config.mcp))
    suites = {suite: _tasks(config, suite, judge) for suite in config.suites}
    if config.policy is None and not engines:
        raise ValueError("no engine to evaluate")
    config.out.mkdir(parents=True, exist_ok=True)  # only once the configuration is known to be valid
    _check_identity(config)
    results = Results(config.out / "results.jsonl")
    earlier = results.rows()
    done = {(r.suite, r.strategy, r.task) for r in earlier}
    run = uuid.uuid4().hex[:12]
    tokens = token_counter(config.count_tokens) if config.policy is not None else tokenize
    trace = TraceWriter(config.trace) if config.trace else None
    tools = connect(config.mcp, config.mcp_scope, config.mcp_timeout,
                    max_sessions=config.mcp_sessions) if config.mcp else None
    with Repository.open(config.db or config.out / "memory.db") as repo:
        if config.redact:  # a key of this run's own: its values are restored within the run, never read after
            from flowstate.store.vault import new_key

            repo.redact(new_key(), config.redact)
        ctx = RunContext(config, repo, results, tuple(engines), run, progress, user, judge, tokens, trace, tools)
        try:
            for suite, tasks in suites.items():
                for strategy in strategies:
                    todo = [(i, t) for i, t in enumerate(tasks) if (suite, strategy.name, t.id) not in done]
                    finished = [r for r in earlier if r.suite == suite and r.strategy == strategy.name
                                and r.task in {t.id for t in tasks}]
                    _run_pair(ctx, suite, strategy, len(tasks), finished, todo)
                    if todo:
                        _record_commit(config.out)
        finally:
            if tools is not None:
                tools.close()
    chosen = select(results.rows(), config, {suite: [t.id for t in tasks] for suite, tasks in suites.items()})
    if SESSIONS in suites:  # each replayed session beside its recording
        from flowstate.eval.stored import render_diff

        replayed = [r for r in chosen if r.suite == SESSIONS]
        (config.out / "sessions.md").write_text(render_diff(replayed, suites[SESSIONS]) + "\n")  # type: ignore[arg-type]
    return chosen


@dataclass(frozen=True)
class RunContext:
    """What every task of one ``run_eval`` shares: its configuration, memory, results file, engines (or the
    reference policy's token counting), the τ³ user and judge, the trace and the MCP tools."""

    config: EvalConfig
    repo: Repository
    results: Results
    engines: tuple[Engine, ...]
    run: str  # this run's id, on each of its rows
    progress: OnProgress
    user: Engine | None = None
    judge: Engine | None = None
    tokens: Callable[[str], Sequence[Any]] = tokenize
    trace: TraceWriter | None = None
    tools: ToolSet | None = None


def _run_pair(ctx: RunContext, suite: str, strategy: Strategy, total: int, finished: list[TaskRow],
              todo: list[tuple[int, Task]]) -> None:
    config, progress, tokens, trace = ctx.config, ctx.progress, ctx.tokens, ctx.trace
    label = f"{suite} × {strategy.name}"
    state = {"done": len(finished), "success": sum(r.success for r in finished), "tokens": 0}
    lock = threading.Lock()
    started = time.monotonic()

    def report() -> None:
        minutes = (time.monotonic() - started) / 60
        rate = (state["done"] - len(finished)) / minutes if minutes > 0 else 0.0
        progress(f"{label}: {state['done']}/{total} tasks, {state['success']} succeeded, "
                 f"{state['tokens']} tokens, {rate:.1f} tasks/min")

    from engine.llamacpp import Vocabulary  # (no llama.cpp import until one is made)

    # a model's vocabulary also counts what each call's grammar forces, as an engine that fast-forwards appends it
    forced = tokens.forced if isinstance(tokens, Vocabulary) else None

    chosen = suite_named(suite)
    rules = chosen.rules

    def one(item: tuple[int, Task]) -> None:
        i, task = item
        limits = strategy.output_limits(config.loop.limits or STANDARD)  # what the model's outputs are held to
        if config.policy is not None or rules.replayed:  # the reference policy the suite declares plays it
            engine: Engine = PolicyEngine(chosen.reference(task, strategy, limits, config.policy), tokens, forced)
        else:
            engine = ctx.engines[i % len(ctx.engines)]  # several servers: tasks spread over all of them
        if trace is not None:
            engine = RecordingEngine(engine, trace, f"{config.namespace}{suite}/{strategy.name}/{task.id}",
                            {"suite": suite, "strategy": strategy.name})
        if rules.conversational:
            talk = run_conversation(task, strategy, engine, ctx.repo, config.loop, ctx.user, ctx.judge,
                                    namespace=config.namespace, guidelines=tau2_guidelines(config.tau2_data),
                                    tools=ctx.tools)
            row = conversation_row(talk, ctx.run)
        else:
            row = run_task(task, strategy, engine, ctx.repo, config.loop, ctx.run, config.namespace)
        ctx.results.append(row)
        with lock:
            state["done"] += 1
            state["success"] += row.success
            state["tokens"] += row.tokens
            report()

    report()
    with ThreadPoolExecutor(max(1, config.concurrency)) as pool:
        for _ in pool.map(one, todo):
            pass


def select(rows: list[TaskRow], config: EvalConfig, tasks: dict[str, list[str]]) -> list[TaskRow]:
    """The rows of this configuration's (suite, strategy, task) triples, the latest of each (``tasks``: the task
    ids of each suite, as the run generated them: never generated again to filter)."""
    wanted = {(s, t) for s, ids in tasks.items() for t in ids}
    latest: dict[tuple[str, str, str], TaskRow] = {}
    for r in rows:
        if (r.suite, r.task) in wanted and r.strategy in config.strategies:
            latest[(r.suite, r.strategy, r.task)] = r
    return list(latest.values())


COUNTS = ("words", "embedded")


def token_counter(name: str) -> Callable[[str], Sequence[Any]]:
    """How the reference policies' tokens are counted: words and punctuation, the embedded model's BPE, or the
    vocabulary of a GGUF file (``name`` ending in .gguf; no weights loaded)."""
    if name == "embedded" or name.endswith(".gguf"):
        from engine.llamacpp import vocabulary

        return vocabulary(None if name == "embedded" else name)
    check_count(name)
    return tokenize


def check_count(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` says how tokens can be counted."""
    if name not in COUNTS and not name.endswith(".gguf"):
        raise ValueError(f"unknown token count {name!r}; valid: {', '.join(COUNTS)} or a .gguf file")


def _tasks(config: EvalConfig, suite: str, judge: Engine | None = None) -> list[Task]:
    from flowstate.eval.stored import Selection

    return generate(suite, config.tasks, Spec(config.depth, config.seed, config.sizes or {}, config.tau2_data,
                                              config.trials, config.replay, judge, Selection.from_dict(config.select)))


def source_label(where: str) -> str:
    """A data source as a run records it: a file's absolute path, a database URL without its password."""
    if "://" not in where:
        return str(Path(where).resolve())
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(where)
    if parts.password is None:
        return where
    host = parts.hostname or "" if parts.port is None else f"{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


# config.json's keys beside the identity: what a run's report shows (a later run into its folder keeps them all),
# and the commits of its code
COVERS = ("suites", "strategies", "commits")


def _check_identity(config: EvalConfig) -> None:
    """A folder holds one run: resumed with the same settings (more tasks, more suites or strategies beside its own),
    never overwritten by another — a report that would leave out a suite or strategy of the folder's is refused."""
    path = config.out / "config.json"
    identity = config.identity()
    covers = {"suites": list(config.suites), "strategies": list(config.strategies)}
    if path.exists():
        before = json.loads(path.read_text())
        changed = {k: (before.get(k), identity.get(k)) for k in {**before, **identity}
                   if k not in COVERS and before.get(k) != identity.get(k)}
        if changed:
            what = ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in changed.items())
            raise ValueError(f"{config.out} holds a run with other settings ({what}): its results would mix with "
                             "this run's in one table; use another --out, or the same settings to resume")
        dropped = {k: sorted(set(before.get(k, [])) - set(covers[k])) for k in covers}
        if any(dropped.values()):
            what = "; ".join(f"{k} {', '.join(v)}" for k, v in dropped.items() if v)
            raise ValueError(f"{config.out} holds another run's results ({what}), which this run's report and "
                             "figures would replace: use another --out (or name them too, to extend that run)")
    commits = json.loads(path.read_text()).get("commits", []) if path.exists() else []
    path.write_text(json.dumps({**identity, **covers, **({"commits": commits} if commits else {})}, indent=2) + "\n")


def _record_commit(out: Path) -> None:
    """The commit of the code that ran tasks into ``out``, beside those of the runs before (config.json)."""
    from engine.distribution import commit

    path = out / "config.json"
    stored = json.loads(path.read_text())
    if commit() not in stored.get("commits", []):
        stored["commits"] = [*stored.get("commits", []), commit()]
        path.write_text(json.dumps(stored, indent=2) + "\n")


def loop_dict(loop: LoopConfig) -> dict[str, Any]:
    """A request's limits as a run records them."""
    repeats = {"max_repeats": loop.max_repeats} if loop.max_repeats != LoopConfig.max_repeats else {}  # earlier runs'
    return {"max_steps": loop.max_steps, "max_protocol_errors": loop.max_protocol_errors, **repeats,
            "max_tokens": loop.max_tokens,
            "grammar": loop.grammar.value, "limits": loop.limits.name if loop.limits else "auto",
            "on_budget": loop.on_budget}


def config_dict(config: EvalConfig) -> dict[str, Any]:
    out = asdict(config)
    out["out"] = str(config.out)
    out["loop"] = loop_dict(config.loop)
    if not config.redact:  # a run without redaction reads as every run before redaction existed
        del out["redact"]
    else:
        out["redact"] = list(config.redact)
    if not config.select:  # likewise a run that replays no stored sessions
        del out["select"]
    if config.replay and "://" in config.replay:
        out["replay"] = source_label(config.replay)  # a database URL's password is never written
    return out
