"""``sessions``: your own stored sessions as an evaluation suite (``flowstate eval --from DB_URL|EXPORT_FILE``).

What would another model, memory method or limit have done to *my* users' sessions? Each chosen session is one
task: its requests' user texts, in order, are replayed through the strategies and engine a run names, as one more
suite beside the others (the same report, figures and result files). The source is a database (a SQLite file or
a ``postgresql://`` URL, opened read-only in effect: nothing is written to it) or a session file (``flowstate
export``), read into memory; the replay's own memory goes to the run's database (``--db``, default OUT/memory.db),
never the source.

Tools are the recording: a call whose name and arguments match a call the session made gets that call's recorded
result (or its recorded error) — the oracle, each recorded result in turn, the last again once they run out — and
any other call is answered as a tool that cannot (an error, "off the record"), counted per request. Every tool the
session called is offered, its parameters' schema inferred from its recorded calls (their keys and JSON types; the
keys every call gave are required): the schemas the live tools declared are not stored with a session. A client's
tools (Chat Completions and Responses tool rounds) are in the recording like the server's: their calls and the
results the client sent back.

A request is scored against the stored answer: ``exact`` (the same text), ``normalized`` (equal once case,
whitespace and punctuation are set aside; the subtask's ``correct``), token F1 (its ``credit``), and with
``--judge`` a model's verdict (its prompt is ``JUDGE``, versioned by ``JUDGE_VERSION``); with the stored feedback
where there is some. The cost columns are the evaluator's own. Under greedy decoding the same inputs replay the same.
"""

from __future__ import annotations

import random
import re
import string
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.base import Engine, Message
from flowstate.eval.replay import RecordedCall, RecordedTurn, ReplayTask
from flowstate.eval.task import Score
from flowstate.nodes import canonical_json
from flowstate.store.repository import Repository
from flowstate.tools import SchemaTool, ToolSet

SUITE = "sessions"
OFF_RECORD = "no recorded result for this call: the stored session never made it (off the record)"
JUDGE_VERSION = "agreement-v1"
JUDGE = (
    "You compare two answers an assistant gave to the same user request: the one it gave in production (REFERENCE) "
    "and a replay's (CANDIDATE). Say whether the candidate tells the user the same thing: the same facts, numbers, "
    "decisions and next steps; wording, order and politeness do not matter; a candidate that adds a wrong fact or "
    "leaves out one the user needs does not agree. Reply with one word: AGREE or DISAGREE."
)


@dataclass(frozen=True)
class Selection:
    """Which stored sessions a run replays: those named, those active since a time, a seeded sample of them, those
    whose feedback is negative (or positive, or any)."""

    sessions: tuple[str, ...] = ()
    since: int | None = None  # unix seconds: sessions active at or after it
    sample: int | None = None  # this many, drawn with ``seed`` from what the rest selects
    seed: int = 0
    feedback: str | None = None  # negative | positive | any

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("sessions", list(self.sessions)), ("since", self.since), ("sample", self.sample),
                                  ("seed", self.seed if self.sample else None), ("feedback", self.feedback)) if v}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Selection:
        return cls(tuple(d.get("sessions") or ()), d.get("since"), d.get("sample"), int(d.get("seed") or 0),
                   d.get("feedback"))


def parse_since(text: str, now: float | None = None) -> int:
    """``7d``, ``12h``, ``30m`` ago, or a date ``YYYY-MM-DD`` (UTC): unix seconds."""
    now = time.time() if now is None else now
    m = re.fullmatch(r"\s*(\d+)\s*([dhm])\s*", text)
    if m:
        return int(now - int(m.group(1)) * {"d": 86400, "h": 3600, "m": 60}[m.group(2)])
    try:
        return int(time.mktime(time.strptime(text.strip(), "%Y-%m-%d")) - time.timezone)
    except ValueError:
        raise ValueError(f"--since takes a duration (7d, 12h, 30m) or a date (YYYY-MM-DD), not {text!r}") from None


@contextmanager
def source(where: str) -> Iterator[Repository]:
    """The stored sessions at ``where``: a session file read into a database in memory, or the database itself."""
    path = Path(where)
    if path.is_file() and _is_session_file(path):
        with Repository.open(":memory:") as repo, path.open(encoding="utf-8") as lines:
            repo.transfer.load(lines)
            yield repo
        return
    if not where.startswith(("postgresql://", "postgres://")) and not path.is_file():
        raise ValueError(f"--from {where}: no such database or session file")
    with Repository.open(where, create=False) as repo:
        yield repo


def _is_session_file(path: Path) -> bool:
    with path.open("rb") as f:
        return b'"flowstate-session"' in f.readline(4096)


def stored_turns(repo: Repository, name: str) -> tuple[str, list[RecordedTurn], list[int], dict[str, dict[str, Any]]]:
    """A stored session as (its client's policy, its requests as turns, the tokens each request took, the tools its
    requests offered by name — the latest spec of each; none for requests stored before specs were kept): each
    request's query, its steps' tool calls with their recorded results (an error as ``ToolError``), its stored
    answer ("" where it ended without)."""
    transcripts = repo.records.transcripts(name)
    first = transcripts.get(min(transcripts)) if transcripts else None
    policy = next((str(m.get("content") or "") for m in (first.messages if first else []) if m.get("role") == "system"),
                  "")  # a session stored before records kept the policy: its client's system message, where kept
    turns, tokens, offered = [], [], {}
    for row in repo.requests(name):
        record = repo.records.request(name, row.index) or {}
        policy = str(record.get("policy") or policy)  # the policy the request ran under (the last one's counts)
        offered.update({str(t["name"]): dict(t) for t in record.get("tools") or []
                        if isinstance(t, dict) and "name" in t})
        steps = tuple(tuple(RecordedCall(c["name"], dict(c.get("arguments") or {}),
                                 RecordedFailure(c["error"]) if "error" in c else c.get("result"))
                            for c in s.get("tool_calls") or [] if not c.get("repeat_of"))
                      for s in record.get("steps") or [])
        turns.append(RecordedTurn(row.query, tuple(s for s in steps if s), row.response or ""))
        usage = record.get("usage") or {}
        tokens.append(int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0)))
    return policy, turns, tokens, offered


@dataclass(frozen=True)
class RecordedFailure:
    """A recorded call that failed: replayed as the same failure."""

    message: str


def _json_type(value: Any) -> str | None:
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
                       (dict, "object")):
        if isinstance(value, kind):
            return name
    return None


def inferred_schema(calls: Sequence[RecordedCall]) -> dict[str, Any]:
    """A tool's parameters as its recorded calls show them: every key given, typed as first seen, those every call
    gave required."""
    props: dict[str, dict[str, Any]] = {}
    for c in calls:
        for k, v in c.arguments.items():
            kind = _json_type(v)
            props.setdefault(k, {"type": kind} if kind else {})
    required = sorted(set.intersection(*(set(c.arguments) for c in calls))) if calls else []
    return {"type": "object", "properties": props, **({"required": required} if required else {})}


class StoredTask(ReplayTask):
    """One stored session, replayed."""

    suite = SUITE

    def __init__(self, task_id: str, policy: str, turns: list[RecordedTurn], judge: Engine | None = None,
                 feedback: dict[int, float] | None = None, tokens: Sequence[int] = (),
                 offered: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(task_id, policy, turns)
        self.judge, self.feedback = judge, feedback or {}
        self.tokens = list(tokens) or [0] * len(turns)  # what each request took when it was served
        self.offered = offered or {}  # the tools the session's requests offered, as their specs were stored

    def new_env(self) -> dict[str, Any]:
        return {"cursor": 0, "mismatches": [], "day": 0, "used": {}, "off_record": {}, "calls": {}}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        recorded: dict[tuple[str, str], list[Any]] = {}
        by_name: dict[str, list[RecordedCall]] = {}
        for c in self.expected:
            recorded.setdefault((c.name, canonical_json(c.arguments)), []).append(c.result)
            by_name.setdefault(c.name, []).append(c)

        def handler(name: str) -> Any:
            def run(given: dict[str, Any], session: str) -> Any:
                k = env["day"]
                env["calls"][k] = env["calls"].get(k, 0) + 1
                key = (name, canonical_json(given))
                results = recorded.get(key)
                if results is None:
                    env["off_record"][k] = env["off_record"].get(k, 0) + 1
                    raise ValueError(OFF_RECORD)
                i = env["used"].get(key, 0)
                env["used"][key] = i + 1
                result = results[min(i, len(results) - 1)]
                if isinstance(result, RecordedFailure):
                    raise ValueError(result.message)
                return result
            return run

        def tool(n: str) -> SchemaTool:
            spec = self.offered.get(n)
            if spec is not None:  # as the session offered it
                return SchemaTool(n, str(spec.get("description", "")), fn=handler(n), check=False,
                                  schema=spec.get("parameters") or {"type": "object"})
            calls = by_name[n]
            return SchemaTool(n, f"A tool of the stored session (parameters inferred from its {len(calls)} recorded "
                                 "call(s)).", fn=handler(n), check=False, schema=inferred_schema(calls))

        return ToolSet([tool(n) for n in [*self.offered, *sorted(set(by_name) - set(self.offered))]])

    def check(self, k: int, response: str | None, env: Any) -> Score:
        stored, given = self.turns[k - 1].answer, response or ""
        normalized = normalize(given) == normalize(stored)
        detail: dict[str, Any] = {"exact": given == stored, "normalized": normalized, "f1": round(f1(given, stored), 3),
                                  "off_record": env["off_record"].get(k, 0),
                                  "recorded_calls": sum(len(s) for s in self.turns[k - 1].steps)}
        if self.judge is not None:
            detail["judge"] = judged(self.judge, self.turns[k - 1].query, stored, given)
        if k in self.feedback:
            detail["feedback"] = self.feedback[k]
        return Score(normalized, detail["f1"], detail)

    def success(self, scores: list[Score]) -> bool:
        """A session agrees when every request's answer agrees (normalized)."""
        return bool(scores) and all(s.correct for s in scores)


def normalize(text: str) -> str:
    table = str.maketrans({c: " " for c in string.punctuation})
    return " ".join(text.casefold().translate(table).split())


def f1(a: str, b: str) -> float:
    """Token F1 of two answers, normalized (1.0 for two empty ones)."""
    x, y = normalize(a).split(), normalize(b).split()
    if not x or not y:
        return float(x == y)
    common = sum(min(x.count(w), y.count(w)) for w in set(x))
    if not common:
        return 0.0
    p, r = common / len(x), common / len(y)
    return 2 * p * r / (p + r)


def judged(judge: Engine, query: str, reference: str, candidate: str) -> float | None:
    """The judge's verdict: 1.0 (agree), 0.0 (disagree), None (it said neither)."""
    user = f"REQUEST:\n{query}\n\nREFERENCE:\n{reference}\n\nCANDIDATE:\n{candidate}"
    said = judge.generate([Message("system", JUDGE), Message("user", user)], max_tokens=8).text.strip().upper()
    return 1.0 if said.startswith("AGREE") else 0.0 if said.startswith("DISAGREE") else None


def choose(repo: Repository, selection: Selection, limit: int) -> list[str]:
    """The sessions ``selection`` names, in the database's order (most recently active first), at most ``limit``."""
    names = list(selection.sessions) or repo.sessions()
    missing = [n for n in names if not repo.has_session(n)]
    if missing:
        raise ValueError(f"--session: no stored session {', '.join(map(repr, missing))}")
    if selection.since is not None:
        active = {row.name: row.active_at for row in _activity(repo)}
        names = [n for n in names if active.get(n, 0) >= selection.since]
    if selection.feedback is not None:
        scored = repo.feedback.by_session()
        keep: dict[str, Callable[[list[float]], bool]] = {
            "negative": lambda s: min(s) < 0, "positive": lambda s: max(s) > 0, "any": lambda s: True}
        if selection.feedback not in keep:
            raise ValueError(f"--feedback is negative, positive or any, not {selection.feedback!r}")
        names = [n for n in names if scored.get(n) and keep[selection.feedback](scored[n])]
    names = [n for n in names if repo.requests(n)]
    if selection.sample is not None and selection.sample < len(names):
        names = sorted(random.Random(selection.seed).sample(names, selection.sample))
    return names[:limit]


def _activity(repo: Repository) -> list[Any]:
    rows, after = [], None
    while True:
        page, more = repo.catalog.page("", limit=500, after=after)
        rows += page
        if not more or not page:
            return rows
        after = page[-1].name


def generate(where: str | None, n: int, selection: Selection = Selection(), judge: Engine | None = None,
             ) -> list[StoredTask]:
    """The chosen sessions at ``where`` as tasks (each named by its session)."""
    if not where:
        raise ValueError("the sessions suite replays stored sessions: give --from DB_URL|EXPORT_FILE")
    with source(where) as repo:
        tasks = []
        for name in choose(repo, selection, n):
            policy, turns, tokens, offered = stored_turns(repo, name)
            tasks.append(StoredTask(name, policy, turns, judge, repo.feedback.latest(name), tokens, offered))
        return tasks


def render_diff(rows: Sequence[Any], tasks: Sequence[StoredTask]) -> str:
    """Each replayed session beside its recording, request by request: the stored answer and the replay's, their
    agreement, the judge's and the feedback where given, tool calls recorded and made, and those off the record."""
    by_id = {t.id: t for t in tasks}
    out = ["# Your sessions, replayed", ""]
    for row in sorted(rows, key=lambda r: (r.task, r.strategy)):
        task = by_id.get(row.task)
        if task is None:
            continue
        agree = sum(s.correct for s in row.subtasks)
        out += [f"## {row.task} × {row.strategy}: {agree}/{len(row.subtasks)} answers agree", "",
                "| request | query | stored answer | replayed answer | exact | normalized | F1 | judge | feedback "
                "| calls recorded / made | off the record | tokens served / replayed |", "|" + "---|" * 12]
        for s in row.subtasks:
            d = s.detail or {}
            turn = task.turns[s.k - 1]
            out.append(f"| {s.k} | {_cell(turn.query)} | {_cell(turn.answer)} | {_cell(s.response or s.error or '')} "
                       f"| {_yes(d.get('exact'))} | {_yes(d.get('normalized'))} | {d.get('f1', '–')} "
                       f"| {d.get('judge', '–') if d.get('judge') is not None else '–'} | {d.get('feedback', '–')} "
                       f"| {d.get('recorded_calls', '–')} / {s.tool_calls if s.tool_calls is not None else '–'} "
                       f"| {d.get('off_record', 0)} | {task.tokens[s.k - 1]} / {s.usage.total} |")
        out.append("")
    return "\n".join(out)


def _cell(text: str, most: int = 80) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= most else flat[: most - 1] + "…"


def _yes(value: Any) -> str:
    return "–" if value is None else "yes" if value else "no"
