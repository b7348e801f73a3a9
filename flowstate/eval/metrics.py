"""Quality, cost and speed figures of an evaluation, as the paper (§4, B.5) and ``vllm bench serve`` define them.

Inputs are result rows (one per task, as ``results.jsonl`` stores them); every function is pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from flowstate.eval.rows import TaskRow as Row
from flowstate.eval.rows import calls_of
from flowstate.eval.tau3.evaluate import Grade
from flowstate.records import BUDGET, LOOPING


def success_rate(rows: Sequence[Row]) -> float:
    """SR: % of tasks that succeed (per suite: the final subtask, or the whole bundle)."""
    return 100.0 * sum(r.success for r in rows) / len(rows) if rows else 0.0


def progress_score(rows: Sequence[Row], micro: bool = False) -> float:
    """PS: % of correct subtasks, averaged per task (``micro``: over all subtasks, as for travel)."""
    if not rows:
        return 0.0
    if micro:
        subtasks = [s for r in rows for s in r.subtasks]
        return 100.0 * sum(s.correct for s in subtasks) / len(subtasks) if subtasks else 0.0
    return 100.0 * sum(sum(s.correct for s in r.subtasks) / len(r.subtasks) for r in rows) / len(rows)


def soft_progress_score(rows: Sequence[Row]) -> float:
    """sPS: % credit for satisfied constraints, averaged over all subtasks."""
    subtasks = [s for r in rows for s in r.subtasks]
    return 100.0 * sum(s.credit for s in subtasks) / len(subtasks) if subtasks else 0.0


def accuracy_by_depth(rows: Sequence[Row]) -> list[float]:
    """Acc_k, k = 1..K: % of tasks with at least k subtasks whose k-th subtask is correct."""
    depth = max((len(r.subtasks) for r in rows), default=0)
    out = []
    for k in range(1, depth + 1):
        having = [r for r in rows if len(r.subtasks) >= k]
        out.append(100.0 * sum(r.subtasks[k - 1].correct for r in having) / len(having))
    return out


def retention(acc: Sequence[float]) -> list[float] | None:
    """R_k = 100 · Acc_k / Acc_1 (undefined when Acc_1 is 0)."""
    if not acc or acc[0] == 0:
        return None
    return [100.0 * a / acc[0] for a in acc]


def nauc(r: Sequence[float]) -> float | None:
    """The trapezoidal integral of R_k over k = 1..K, divided by the depth range K − 1."""
    if len(r) < 2:
        return None
    return sum((r[i] + r[i + 1]) / 2 for i in range(len(r) - 1)) / (len(r) - 1)


def decline_rate(r: Sequence[float]) -> float | None:
    """DR: the negative least-squares slope of R_k against k (points per subtask)."""
    if len(r) < 2:
        return None
    ks = range(1, len(r) + 1)
    mk, mr = sum(ks) / len(r), sum(r) / len(r)
    slope = sum((k - mk) * (v - mr) for k, v in zip(ks, r, strict=True)) / sum((k - mk) ** 2 for k in ks)
    return -slope


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float]:
    mean = sum(values) / len(values) if values else 0.0
    return {"mean": mean, "p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99)}


def quality(rows: Sequence[Row], soft: bool = False, micro: bool = False) -> dict[str, Any]:
    acc = accuracy_by_depth(rows)
    r = retention(acc)
    out: dict[str, Any] = {
        "tasks": len(rows), "SR": success_rate(rows), "PS": progress_score(rows, micro), "Acc_k": acc, "R_k": r,
        "nAUC": nauc(r) if r else None, "DR": decline_rate(r) if r else None,
    }
    if soft:
        out["sPS"] = soft_progress_score(rows)
    return out


def cost(rows: Sequence[Row]) -> dict[str, Any]:
    subtasks = [s for r in rows for s in r.subtasks]
    totals = {"prompt_tokens": sum(s.usage.prompt_tokens for s in subtasks),
              "cached_tokens": sum(s.usage.cached_tokens for s in subtasks),
              "completion_tokens": sum(s.usage.completion_tokens for s in subtasks)}
    n = max(len(rows), 1)
    tools = [s.tool_calls for s in subtasks if s.tool_calls is not None]
    counted = bool(subtasks) and len(tools) == len(subtasks)
    return {
        **totals,
        "total_tokens": totals["prompt_tokens"] + totals["completion_tokens"],
        "tokens_per_task": (totals["prompt_tokens"] + totals["completion_tokens"]) / n,
        "prompt_tokens_per_task": totals["prompt_tokens"] / n,
        "completion_tokens_per_task": totals["completion_tokens"] / n,
        "uncached_prompt_tokens": totals["prompt_tokens"] - totals["cached_tokens"],
        "uncached_prompt_tokens_per_task": (totals["prompt_tokens"] - totals["cached_tokens"]) / n,
        "cached_prompt_tokens_per_task": totals["cached_tokens"] / n,
        "cached_share": totals["cached_tokens"] / totals["prompt_tokens"] if totals["prompt_tokens"] else 0.0,
        "steps_per_subtask": sum(s.steps for s in subtasks) / max(len(subtasks), 1),
        "parse_failures": sum(s.parse_failures for s in subtasks),
        "truncations": sum(s.truncations for s in subtasks),
        "rejected_operations": sum(s.rejected for s in subtasks),
        "failed_requests": sum(s.response is None for s in subtasks),
        # what the model did: tool calls and the share of subtasks with one (None for rows of older runs), calls
        # refused as repeats, requests ended as loops or at the step budget
        "tool_calls": sum(tools) if counted else None,
        "tool_use": sum(t > 0 for t in tools) / max(len(subtasks), 1) if counted else None,
        "repeated_calls": sum(s.repeated_calls for s in subtasks),
        "loops": sum((s.error or "").startswith(LOOPING) for s in subtasks),
        "budget_ends": sum((s.error or "").startswith(BUDGET) for s in subtasks),
    }


def pass_hat_k(rows: Sequence[Row]) -> list[float]:
    """τ³'s pass^k, k = 1..n: per task with n trials and c successes C(c, k) / C(n, k), averaged over the scored
    tasks (%): a task with an unscored trial (a reward-basis check did not run) is left out, never passed."""
    trials: dict[str, list[bool]] = {}
    unscored = {r.base_task or r.task for r in rows if r.tau3 is not None and r.tau3.grade.reward is None}
    for r in rows:
        if (r.base_task or r.task) not in unscored:
            trials.setdefault(r.base_task or r.task, []).append(r.success)
    n = min((len(v) for v in trials.values()), default=0)
    return [100.0 * sum(math.comb(sum(v), k) / math.comb(len(v), k) for v in trials.values()) / len(trials)
            for k in range(1, n + 1)]


def tau3_quality(rows: Sequence[Row]) -> dict[str, Any]:
    """τ³'s figures: pass^k, DB accuracy, action accuracy (every gold action matched), communicate and NL
    accuracy where they ran — over the conversations that ended normally, as tau2 computes no check of one cut
    short —, which checks ran, and gold actions that failed on our tools."""
    talks = [r.tau3 for r in rows if r.tau3 is not None]
    graded = [t.grade for t in talks]
    ended = [g for g in graded if g.ended_normally]  # tau2 computes no check of the others
    unscored = [g for g in graded if g.reward is None]

    def share(pred: Callable[[Grade], bool]) -> float | None:
        return 100.0 * sum(pred(g) for g in ended) / len(ended) if ended else None

    nl = [g.nl for g in ended if g.nl]  # where a judge graded assertions (none to grade: nothing to report)
    compared = [t for t in talks if t.results_compared is not None]
    return {
        "runs": len(graded), "ended_normally": len(ended), "pass_k": pass_hat_k(rows),
        "db_accuracy": share(lambda g: g.db_match),
        "action_accuracy": share(lambda g: all(g.actions)),
        "communicate_accuracy": share(lambda g: all(g.communicate)),
        "nl_accuracy": 100.0 * sum(all(v) for v in nl) / len(nl) if nl else None,
        "checks_run": sorted({c for g in graded for c in g.checks_run}),
        "checks_skipped": sorted({c for g in graded for c in g.checks_skipped}),
        "scored_runs": len(graded) - len(unscored), "unscored_runs": len(unscored),
        # unscored runs' DB check alone, under its own name (not a reward): normal end and the database right
        "db_only": 100.0 * sum(g.db_match and g.ended_normally for g in unscored) / len(unscored) if unscored else None,
        "gold_errors": sum(len(g.gold_errors) for g in graded),
        "ended_by": {e: sum(t.ended_by == e for t in talks) for e in sorted({t.ended_by for t in talks})},
        # tools from an MCP server: its results compared, call by call, with the domain's own tools'
        **({"results_compared": sum(t.results_compared or 0 for t in compared),
            "results_differ": sum(len(t.results_differ or ()) for t in compared),
            "tasks_with_differences": sum(bool(t.results_differ) for t in compared)} if compared else {}),
    }


def by_depth(rows: Sequence[Row]) -> list[dict[str, float]]:
    """Per subtask depth k (the paper's Fig. 3 shape): mean model calls and tokens of the k-th subtask."""
    depth = max((len(r.subtasks) for r in rows), default=0)
    out = []
    for k in range(1, depth + 1):
        subtasks = [r.subtasks[k - 1] for r in rows if len(r.subtasks) >= k]
        n = len(subtasks)
        prompt = sum(s.usage.prompt_tokens for s in subtasks) / n
        cached = sum(s.usage.cached_tokens for s in subtasks) / n
        completion = sum(s.usage.completion_tokens for s in subtasks) / n
        out.append({"k": k, "calls": sum(s.steps for s in subtasks) / n, "prompt_tokens": prompt,
                    "cached_tokens": cached, "uncached_prompt_tokens": prompt - cached,
                    "completion_tokens": completion, "tokens": prompt + completion})
    return out


def wall_time(rows: Sequence[Row]) -> float:
    """Seconds the rows' tasks took, per run of the evaluation (a resumed pair sums its runs)."""
    spans: dict[str, tuple[float, float]] = {}
    for r in rows:
        lo, hi = spans.get(r.run, (r.started, r.ended))
        spans[r.run] = (min(lo, r.started), max(hi, r.ended))
    return sum(hi - lo for lo, hi in spans.values())


def speed(rows: Sequence[Row]) -> dict[str, Any]:
    """Throughput and latency in ``vllm bench serve``'s terms; one model call is one request."""
    calls = calls_of([s for r in rows for s in r.subtasks])
    wall = wall_time(rows)
    completion = sum(c.completion_tokens for c in calls)
    total = sum(c.prompt_tokens + c.completion_tokens for c in calls)
    tpot = [c.decode_s / (c.completion_tokens - 1) for c in calls if c.completion_tokens > 1]
    per = (lambda x: x / wall) if wall > 0 else (lambda x: 0.0)
    return {
        "wall_s": wall, "model_calls": len(calls),
        "tasks_per_min": per(len(rows)) * 60, "requests_per_s": per(len(calls)),
        "output_tok_per_s": per(completion), "total_tok_per_s": per(total),
        "ttft_s": distribution([c.ttft_s for c in calls]), "tpot_s": distribution(tpot),
        "e2el_s": distribution([c.ttft_s + c.decode_s for c in calls]),
    }
