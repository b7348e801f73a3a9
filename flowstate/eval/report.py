"""The evaluation's answer: ``summary.json``, a Markdown report with the tables side by side, and figures.

Each strategy is compared with ``full-context`` as the paper's tables do: Δ in points for quality,
Δ in % for tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowstate.eval import gpu, kv, metrics
from flowstate.eval.kv import footprint
from flowstate.eval.rows import TaskRow, calls_of
from flowstate.eval.runner import EvalConfig, config_dict
from flowstate.eval.suites import TAU3
from flowstate.eval.suites import suite as suite_named
from flowstate.memory import EMBEDDING

BASELINE = "full-context"


def summarize(rows: Sequence[TaskRow], config: EvalConfig) -> dict[str, Any]:
    pairs = []
    kv_model = kv.load(config.kv_model)
    cost = gpu.load(config.gpu_cost, config.decode_weight)
    for name in config.suites:
        rules = suite_named(name).rules
        for strategy in config.strategies:
            rs = [r for r in rows if r.suite == name and r.strategy == strategy]
            pairs.append({
                "suite": name, "strategy": strategy,
                "quality": metrics.quality(rs, soft=rules.soft, micro=rules.micro_ps),
                "cost": metrics.cost(rs), "by_depth": metrics.by_depth(rs), "speed": metrics.speed(rs),
                **({"tau3": metrics.tau3_quality(rs)} if name in TAU3 and rs else {}),
                "kv": footprint(rs, kv_model, config.gpu_memory_gib),
                "gpu": gpu_figures(rs, cost),
                "n": {"tasks": len(rs), "subtasks": sum(len(r.subtasks) for r in rs)},
            })
    return {"config": config_dict(config), "pairs": pairs, **_commits(config)}


def _commits(config: EvalConfig) -> dict[str, Any]:
    """The commits of the code that ran this folder's tasks, as config.json keeps them (none: a run stored before)."""
    path = config.out / "config.json"
    commits = json.loads(path.read_text()).get("commits") if path.exists() else None
    return {"commits": commits} if commits else {}


def gpu_figures(rows: Sequence[TaskRow], cost: gpu.GPUCost) -> dict[str, Any]:
    """Per task: what a GPU pays (``GPUCost.pet``'s parts: uncached prefill with the fixed prefix shared, forced and
    decoded tokens, PET), and disclosure steps (model calls that only asked for history)."""
    n = max(len(rows), 1)
    figures = cost.pet(calls_of([s for r in rows for s in r.subtasks]))
    return {"cost": {"label": cost.label, "w": cost.w, "kappa": cost.kappa},
            **{f"{k}_per_task": v / n for k, v in figures.items()},
            "disclosure_steps_per_task": sum(s.disclosure_steps for r in rows for s in r.subtasks) / n}


def _f(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x + 0.0:.{digits}f}".replace("-0.0", "0.0")


def _delta_points(x: float | None, base: float | None) -> str:
    return "" if x is None or base is None else f" ({x - base:+.1f})"


def _delta_pct(x: float, base: float) -> str:
    return "" if not base else f" ({100 * (x - base) / base:+.1f}%)"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def settings(c: dict[str, Any]) -> str:
    """Every setting that changes a result, in one line: it heads every table, so no table is read without them."""
    parts = [f"policy={c['policy']}" if c["policy"] else f"engine={c['engine']}",
             *(f"{k}={v}" for k, v in sorted((c.get("decoding") or {}).items())),
             *(f"{k}={v}" for k, v in c["loop"].items()), f"depth={c['depth']}", f"seed={c['seed']}",
             *(f"{k}={v}" for k, v in sorted((c.get("sizes") or {}).items())),
             *([f"count_tokens={c['count_tokens']}"] if c.get("count_tokens", "words") != "words" else [])]
    return "Settings: " + ", ".join(parts) + "."


def _ranking(c: dict[str, Any]) -> str:
    """What the methods whose sources embed ranked by here: ``--embed``'s vectors, or BM25 standing in."""
    named = [s for s in c["strategies"] if s in EMBEDDING]
    if not named:
        return ""
    if c.get("embed"):
        return f" {' and '.join(named)} rank by the embeddings of {c['embed']}, as their sources do."
    return (f" {' and '.join(named)}: BM25 stands in for the embeddings their sources rank by (no --embed).")


def _chosen(config: dict[str, Any]) -> str:
    """Which stored sessions a run replays, as its --from options chose them."""
    select = config.get("select") or {}
    said = [f"{k} {', '.join(v) if isinstance(v, list) else v}" for k, v in select.items()]
    cap = [f"at most {config['tasks']}"] if config["tasks"] < 1_000_000 else []
    return "; ".join(said + cap) or "every one"


def markdown(summary: dict[str, Any], drawn: Sequence[str] | None = None) -> str:
    """The report; ``drawn``: the figures written beside it (None: the three a run with the plots extra draws)."""
    c = summary["config"]
    out = [
        "# FlowState evaluation",
        "",
        f"Suites {', '.join(c['suites'])}; strategies {', '.join(c['strategies'])}; "
        + (f"{c['tasks']} tasks of depth {c['depth']} per suite (seed {c['seed']})"
           if list(c["suites"]) != ["sessions"] else
           f"stored sessions from {c.get('replay')} ({_chosen(c)})")
        + f"; engine {c['policy'] or c['engine']}; {c['concurrency']} in flight; "
        f"step budget {c['loop']['max_steps']}, grammar {c['loop']['grammar']}, "
        f"limits {c['loop'].get('limits', 'auto')}."
        + (f" τ³ suites: one conversation per task ({c.get('trials', 1)} trial(s)), user "
           f"{c.get('user') or 'scripted'}, judge {c.get('judge') or 'none'}." if set(c["suites"]) & set(TAU3) else "")
        + (f" memoryarena: graded by the judge {c['judge']} with MemoryArena's prompt." if c.get("judge") else
           " memoryarena: graded by exact match after normalisation (no --judge; MemoryArena grades with a judge "
           "model)." if "memoryarena" in c["suites"] else "")
        + _ranking(c),
    ]
    out += [*_provenance(summary), "", settings(c), *_bounds(c)]
    if len(c["suites"]) > 1 or len(c["strategies"]) > 2:
        out += ["", "## Every strategy against full-context", "", settings(c), "", *_overview(summary)]
    if {"flowstate", "mage"} <= set(c["strategies"]):
        out += ["", "## FlowState and MAGE head to head", "", *_head_to_head(summary)]
    for suite in c["suites"]:
        out += ["", f"## {suite}", "", settings(c), "",
                *_suite_section(suite, [p for p in summary["pairs"] if p["suite"] == suite], c["policy"])]
    shown = FIGURES if drawn is None else drawn
    out += ["", ("Figures: " + ", ".join(f"`{f}`" for f in shown) + ".") if shown else
            "Figures: none (the plots extra draws them, and a figure of one point is left to the tables above).", ""]
    return "\n".join(out)


def _provenance(summary: dict[str, Any]) -> list[str]:
    """The code's commit(s) and how many tasks and subtasks each figure averages (where the run recorded them)."""
    out = []
    if summary.get("commits"):
        out.append("Code: commit " + ", then ".join(summary["commits"]) + ".")
    n = [(p["suite"], p["n"]) for p in summary["pairs"] if "n" in p]
    if n:
        per = {s: f"{v['tasks']} tasks, {v['subtasks']} subtasks" for s, v in n}
        out.append("n per strategy: " + "; ".join(f"{s} {v}" for s, v in per.items()) + ".")
    return ["", *out] if out else []


def _bounds(c: dict[str, Any]) -> list[str]:
    """What a reference policy's figures are: a bound, and where a strategy's memory cannot reach 100."""
    if not c["policy"]:
        return []
    from flowstate.eval.policies import BOUNDED

    out = ["", f"Reference policy {c['policy']}: {BOUNDS[c['policy']]}."]
    deep = [s for s in c["suites"] if s not in (*TAU3, "memoryarena", "sessions", "tau-replay")]  # --depth's suites
    if c["policy"] != "memoryless" and "flowstate" in c["strategies"] and deep and c["depth"] < CROSSOVER:
        out += ["", f"Read tokens against full-context at depth {c['depth']} as this session length's, not the "
                f"method's verdict: on 200 recorded conversations joined into longer sessions, FlowState's tokens "
                f"break even with full context at about {CROSSOVER} requests and fall below it past that "
                "(docs/results/crossover.md); its GPU cost (PET) did not break even in that range."]
    out += [f"- {name} cannot reach SR 100 here by design: {why}." for name, why in BOUNDED.items()
            if name in c["strategies"] and c["policy"] != "memoryless"]
    return out


CROSSOVER = 10  # requests a session where FlowState's tokens meet full context's (docs/results/crossover.md)
BOUNDS = {
    "oracle": "the optimistic bound (best case for memory methods): it records only what later subtasks need, "
              "finds it by exact keys and asks for it together with actions that do not need it; a model can only "
              "do worse",
    "realistic": "a realistic bound: it records every tool result it used with its facts, finds earlier states by "
                 "the words of the new query and asks for them in a step of its own before it acts (tau-replay: "
                 "when its next recorded action needs an earlier value not in view); not a best case",
    "memoryless": "the memoryless bound: it never reads memory",
}
"""What each reference policy's figures are, as the reports label them."""


def _suite_section(suite: str, pairs: list[dict[str, Any]], policy: str | None = None) -> list[str]:
    """One suite's tables: quality, what a GPU pays, tokens and accuracy by depth, speed (a model's only: a
    reference ``policy`` has none). A replay of stored sessions scores agreement with the recording, not success."""
    base = next((p for p in pairs if p["strategy"] == BASELINE), None)
    soft = any("sPS" in p["quality"] for p in pairs)
    quality = ["last request agrees", "agreement"] if suite == "sessions" else ["SR", "PS"]
    header = ["strategy", *quality, *(["sPS"] if soft else []), "tokens/task", "nAUC", "DR", "steps/subtask",
              "cached", "parse failures", "truncated", "rejected ops", "failed requests", "tool use", "repeated calls",
              "loops"]
    rows = []
    for p in pairs:
        q, k = p["quality"], p["cost"]
        bq = base["quality"] if base and p is not base else None
        bk = base["cost"] if base and p is not base else None
        rows.append([
            p["strategy"],
            _f(q["SR"]) + _delta_points(q["SR"], bq and bq["SR"]),
            _f(q["PS"]) + _delta_points(q["PS"], bq and bq["PS"]),
            *([_f(q.get("sPS")) + _delta_points(q.get("sPS"), bq and bq.get("sPS"))] if soft else []),
            f"{k['tokens_per_task']:.0f}" + (_delta_pct(k["tokens_per_task"], bk["tokens_per_task"]) if bk else ""),
            _f(q["nAUC"]), _f(q["DR"]), f"{k['steps_per_subtask']:.2f}", f"{100 * k['cached_share']:.0f}%",
            str(k["parse_failures"]), str(k["truncations"]), str(k["rejected_operations"]), str(k["failed_requests"]),
            "–" if k.get("tool_use") is None else f"{100 * k['tool_use']:.0f}%", str(k.get("repeated_calls", 0)),
            str(k.get("loops", 0)),
        ])
    depth = max((len(p["quality"]["Acc_k"]) for p in pairs), default=0)
    acc_rows = [[p["strategy"], *(_f(a) for a in p["quality"]["Acc_k"])] for p in pairs]
    speed_rows = [_speed_row(p) for p in pairs]
    paid_rows = [_paid_row(p, base) for p in pairs]
    depth_rows = [[p["strategy"], *(f"{d['tokens']:.0f} / {d['calls']:.1f}" for d in p["by_depth"])] for p in pairs]
    out = _tau3_section(pairs, base) if suite in TAU3 else []
    out += [
        "Quality in % (Δ against full-context in points), tokens = prompt + completion per task "
        "(Δ in %), nAUC and DR over R_k = 100·Acc_k/Acc_1; tool use = subtasks with a tool call, repeated calls "
        "= calls refused as repeats of an earlier call of the request, loops = requests ended for repeating.", "",
        _table(header, rows), "", *_idle_note(pairs),
        "What a GPU pays, per task: prompt tokens split into those a prefix cache holds (cached, over the "
        "session's previous call) and those it must compute (uncached); U′, uncached with the deployment's fixed "
        "prefix (the system message) shared across sessions; completion tokens decoded one step each and forced by "
        "the grammar (appended in one pass, where the engine does); PET, prefill-equivalent tokens (U′ + forced + "
        f"w·decoded + κ·context attended while decoding) for {cost_label(pairs)}; disclosure steps (calls that only "
        "asked for history) per task; ratios against full-context:", "",
        _table(["strategy", "prompt", "cached", "uncached", "U′", "decoded", "forced", "PET", "calls/subtask",
                "disclosure steps", "tokens ×FC", "uncached ×FC", "U′ ×FC", "decoded ×FC", "PET ×FC"], paid_rows), "",
        *_session_section(pairs, base),
        "Tokens / model calls of the k-th subtask (mean over tasks):", "",
        _table(["strategy", *(f"k={k}" for k in range(1, depth + 1))], depth_rows), "",
        "Accuracy by subtask depth, Acc_k in %:", "",
        _table(["strategy", *(f"k={k}" for k in range(1, depth + 1))], acc_rows), "",
    ]
    if policy:
        return [*out, f"No speed table: the reference policy {policy} answers without a model, so its timings are "
                "the harness's, not an engine's."]
    return [*out, "Speed (one model call = one request; TTFT and E2EL in s, TPOT in ms; mean / p50 / p90 / p99):", "",
            _table(["strategy", "tasks/min", "req/s", "output tok/s", "total tok/s", "TTFT", "TPOT", "E2EL"],
                   speed_rows)]


def _idle_note(pairs: list[dict[str, Any]]) -> list[str]:
    """A method that called no tool did none of the work: its cost figures are not savings."""
    idle = [p["strategy"] for p in pairs if p["cost"].get("tool_calls") == 0]
    if not idle:
        return []
    return [f"Note: {', '.join(idle)} made no tool call in any subtask: {'its' if len(idle) == 1 else 'their'} "
            "token figures are those of a method that did not do the work, not savings.", ""]


def _paid_row(p: dict[str, Any], base: dict[str, Any] | None) -> list[str]:
    """What a GPU pays for one strategy, per task, and its ratios against full context."""
    k, bk = {**p["cost"], **p["gpu"]}, {**base["cost"], **base["gpu"]} if base else None

    def ratio(key: str) -> str:
        return f"{k[key] / bk[key]:.3f}" if bk and bk[key] else "–"

    return [
        p["strategy"], f"{k['prompt_tokens_per_task']:.0f}", f"{k['cached_prompt_tokens_per_task']:.0f}",
        f"{k['uncached_prompt_tokens_per_task']:.0f}", f"{k['shared_uncached_per_task']:.0f}",
        f"{k['decoded_per_task']:.0f}", f"{k['forced_per_task']:.0f}", f"{k['pet_per_task']:.0f}",
        f"{k['steps_per_subtask']:.2f}", f"{k['disclosure_steps_per_task']:.2f}", ratio("tokens_per_task"),
        ratio("uncached_prompt_tokens_per_task"), ratio("shared_uncached_per_task"), ratio("decoded_per_task"),
        ratio("pet_per_task"),
    ]


def cost_label(pairs: Sequence[dict[str, Any]]) -> str:
    """The GPU cost a table's PET is for (every pair of a summary has the same)."""
    c = next((p["gpu"].get("cost") for p in pairs if p.get("gpu")), None)
    return f"{c['label']} (w = {c['w']:.2f}, κ = {c['kappa']:.2e})" if c else "the configured GPU cost"


def _session_section(pairs: list[dict[str, Any]], base: dict[str, Any] | None) -> list[str]:
    """What a session holds on a GPU: context per call, peak context per session, its KV cache, how many fit."""
    first = next((p["kv"] for p in pairs if p.get("kv")), None)
    if first is None:
        return []
    bk = base.get("kv") if base else None
    rows = []
    for p in pairs:
        k = p.get("kv") or {}
        if not k:
            continue
        ratio = f"{k['peak_context'] / bk['peak_context']:.3f}" if bk else "–"
        rows.append([p["strategy"], f"{k['context_per_call']:.0f}", f"{k['peak_context']:.0f}",
                     f"{k['max_peak_context']:.0f}",
                     ratio, f"{k['session_gib']:.3f}", "–" if k["sessions_fit"] is None else str(k["sessions_fit"])])
    return [f"What a session holds on a GPU, for {first['model']} ({first['bytes_per_token']:,} KV bytes per token of "
            f"context) on {first['gpu_gib']:g} GiB beside its weights: context per call, peak context per session "
            "(mean over tasks, and the largest), its ratio to full-context, the KV cache at the mean peak, and how "
            "many sessions of that peak fit (`--kv-model MODEL@GIB`):", "",
            _table(["strategy", "context/call", "peak context", "largest peak", "peak ×FC", "KV GiB/session",
                    "sessions that fit"], rows), ""]


def _speed_row(p: dict[str, Any]) -> list[str]:
    s = p["speed"]
    return [
        p["strategy"], f"{s['tasks_per_min']:.2f}", f"{s['requests_per_s']:.2f}", f"{s['output_tok_per_s']:.1f}",
        f"{s['total_tok_per_s']:.1f}",
        " / ".join(f"{s['ttft_s'][m]:.2f}" for m in ("mean", "p50", "p90", "p99")),
        " / ".join(f"{1000 * s['tpot_s'][m]:.1f}" for m in ("mean", "p50", "p90", "p99")),
        " / ".join(f"{s['e2el_s'][m]:.2f}" for m in ("mean", "p50", "p90", "p99")),
    ]


def _overview(summary: dict[str, Any]) -> list[str]:
    """The paper's Table 1 shape: per suite each strategy's SR (Δ in points) and tokens per task (Δ in %)
    against full-context, the mean of the Δs over the suites and the Δ of the summed totals."""
    c = summary["config"]
    by = {(p["suite"], p["strategy"]): p for p in summary["pairs"]}
    rows = [[strategy, *against_baseline(by, c["suites"], strategy, deltas_in_cells=True)]
            for strategy in c["strategies"]]
    return [
        "SR % / tokens per task in each suite (Δ against full-context: SR in points, tokens in %); the mean of the "
        "per-suite Δs, and the Δ of the summed totals over all suites (the paper's comparison: every task's "
        "successes and tokens added up):",
        "", _table(["strategy", *c["suites"], "mean Δ (SR, tokens)", "Δ of totals (SR, tokens)"], rows), "",
    ]


def against_baseline(by: dict[tuple[str, str], dict[str, Any]], suites: Sequence[str], strategy: str,
                     deltas_in_cells: bool = False) -> list[str]:
    """One strategy's cells per suite (SR % / tokens per task, with its Δs where asked), then the mean of the
    per-suite Δs and the Δ of the summed totals against ``BASELINE`` in the same pairs."""
    cells, d_sr, d_tok = [], [], []
    totals = [0.0, 0.0, 0.0, 0.0, 0.0]  # successes, tokens; the baseline's successes, tokens; tasks
    for suite in suites:
        p, b = by.get((suite, strategy)), by.get((suite, BASELINE))
        if p is None:
            cells.append("–")
            continue
        sr, tok = p["quality"]["SR"], p["cost"]["tokens_per_task"]
        cell = f"{sr:.1f} / {tok:.0f}"
        if b is not None and strategy != BASELINE:
            n, base_tok = p["quality"]["tasks"], b["cost"]["tokens_per_task"]
            d_sr.append(sr - b["quality"]["SR"])
            if base_tok:
                d_tok.append(100 * (tok - base_tok) / base_tok)
            totals = [totals[0] + sr * n / 100, totals[1] + tok * n, totals[2] + b["quality"]["SR"] * n / 100,
                      totals[3] + base_tok * n, totals[4] + n]
            if deltas_in_cells:
                cell += f" ({d_sr[-1]:+.1f}, {d_tok[-1]:+.1f}%)" if base_tok else f" ({d_sr[-1]:+.1f})"
        cells.append(cell)
    mean = f"{sum(d_sr) / len(d_sr):+.1f}, {sum(d_tok) / len(d_tok):+.1f}%" if d_sr and d_tok else "–"
    return [*cells, mean, summed_delta(totals) if strategy != BASELINE else "–"]


def summed_delta(totals: Sequence[float]) -> str:
    """Δ of summed totals: SR over all tasks in points, summed tokens in %, against the baseline's."""
    wins, tokens, base_wins, base_tokens, n = totals
    if not n or not base_tokens:
        return "–"
    return f"{100 * (wins - base_wins) / n:+.1f}, {100 * (tokens - base_tokens) / base_tokens:+.1f}%"


def _head_to_head(summary: dict[str, Any]) -> list[str]:
    """flowstate against mage per suite: quality, retention and tokens side by side."""
    by = {(p["suite"], p["strategy"]): p for p in summary["pairs"]}
    rows = []
    for suite in summary["config"]["suites"]:
        f, m = by.get((suite, "flowstate")), by.get((suite, "mage"))
        if f is None or m is None:
            continue
        ratio = f["cost"]["tokens_per_task"] / m["cost"]["tokens_per_task"] if m["cost"]["tokens_per_task"] else None
        rows.append([suite, f"{f['quality']['SR']:.1f} / {m['quality']['SR']:.1f}",
                     f"{f['quality']['PS']:.1f} / {m['quality']['PS']:.1f}",
                     f"{_f(f['quality']['nAUC'])} / {_f(m['quality']['nAUC'])}",
                     f"{f['cost']['tokens_per_task']:.0f} / {m['cost']['tokens_per_task']:.0f}", _f(ratio, 3),
                     f"{f['cost']['steps_per_subtask']:.2f} / {m['cost']['steps_per_subtask']:.2f}"])
    return ["flowstate / mage in each suite; tokens per task include MAGE's Compress and Maintain calls.", "",
            _table(["suite", "SR", "PS", "nAUC", "tokens/task", "flowstate ÷ mage tokens", "steps/subtask"], rows), ""]


def _tau3_section(pairs: list[dict[str, Any]], base: dict[str, Any] | None) -> list[str]:
    """τ³'s figures (pass^k, DB / action / communicate / NL accuracy) and the token ratio to full-context."""
    rows = []
    for p in pairs:
        t = p.get("tau3")
        if not t:
            continue
        ratio = f"{p['cost']['tokens_per_task'] / base['cost']['tokens_per_task']:.3f}" \
            if base and base["cost"]["tokens_per_task"] else "–"
        rows.append([p["strategy"], str(t["runs"]), str(t["scored_runs"]),
                     " / ".join(f"{x:.1f}" for x in t["pass_k"]) or "–", _f(t["db_only"]), _f(t["db_accuracy"]),
                     _f(t["action_accuracy"]), _f(t["communicate_accuracy"]), _f(t["nl_accuracy"]),
                     f"{p['cost']['tokens_per_task']:.0f}", ratio, str(t["gold_errors"])])
    if not rows:
        return []
    first = next(p["tau3"] for p in pairs if p.get("tau3"))
    skipped = ", ".join(first["checks_skipped"])
    note = (f"User: {first.get('user', 'scripted')}. Checks run: {', '.join(first['checks_run'])}"
            + (f"; not run on {first['unscored_runs']} of {first['runs']} runs: {skipped} (give --judge for NL "
               "assertions). A task whose reward basis holds "
               "a check that did not run is unscored — left out of pass^k, never passed; its DB check alone is "
               "the DB-only figure, which is not a reward" if skipped else "") + ".")
    if "results_compared" in first:
        compared = [(p["strategy"], p["tau3"]) for p in pairs if p.get("tau3")]
        note += (" Tools from MCP servers (--mcp): each call's result compared with the domain's own tools' for the "
                 "same call, in order on a fresh database — " + "; ".join(
                     f"{name}: {t['results_differ']} of {t['results_compared']} differ "
                     f"({t['tasks_with_differences']} tasks)" for name, t in compared)
                 + " (the DB check replays the calls on the domain's own tools, as tau2's does, so a server whose "
                   "state went astray shows here, not in the reward).")
    return [
        "τ³ figures, graded as tau2 grades: a conversation cut by the turn cap, a failed request or 10 tool errors "
        "scores 0; pass^k for k = 1..trials over the scored runs (their number); DB-only over the unscored runs; DB, "
        "action (every gold action matched), communicate and NL accuracy (where a judge graded assertions) over the "
        "runs that ended normally (tau2 computes no check of the others), in %; tokens per task "
        "and their ratio to full-context; gold actions that failed on a fresh database (τ³ ignores them, as here).",
        "", note, "",
        _table(["strategy", "runs", "scored", "pass^k", "DB-only", "DB", "action", "communicate", "NL",
                "tokens/task", "×FC", "gold errors"], rows), "",
    ]


def figures(summary: dict[str, Any], out: Path) -> list[Path]:
    """The figures a run's numbers make, written into ``out``: accuracy and tokens by subtask depth (integer ticks;
    none where each line would be one point) and tokens against SR (none for a single point): what they show, the
    report's tables show too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    suites = summary["config"]["suites"]
    strategies = summary["config"]["strategies"]
    def per_suite(name: str, ylabel: str, note: str, draw: Callable[[Any, dict[str, Any]], None]) -> Path:
        """One panel per suite, one line (or two) per strategy."""
        fig, axes = plt.subplots(1, len(suites), figsize=(4.2 * len(suites), 3.6), squeeze=False)
        for ax, suite in zip(axes[0], suites, strict=True):
            for p in (p for p in summary["pairs"] if p["suite"] == suite):
                draw(ax, p)
            ax.set_title(suite + note)
            ax.set_xlabel("subtask k")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    def accuracy_line(ax: Any, p: dict[str, Any]) -> None:
        acc = p["quality"]["Acc_k"]
        ax.plot(range(1, len(acc) + 1), acc, marker="o", label=p["strategy"])
        ax.set_ylim(-5, 105)

    def token_lines(ax: Any, p: dict[str, Any]) -> None:
        ks = [d["k"] for d in p["by_depth"]]
        line = ax.plot(ks, [d["tokens"] for d in p["by_depth"]], marker="o", label=p["strategy"])[0]
        ax.plot(ks, [d["uncached_prompt_tokens"] for d in p["by_depth"]], linestyle="--", color=line.get_color())

    drawn = []
    if max((len(p["quality"]["Acc_k"]) for p in summary["pairs"]), default=0) > 1:
        drawn.append(per_suite("accuracy_by_depth.png", "Acc_k (%)", "", accuracy_line))
    if len(summary["pairs"]) > 1:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        markers = "osD^v<>"
        for i, strategy in enumerate(strategies):
            pts = [p for p in summary["pairs"] if p["strategy"] == strategy]
            ax.scatter([p["cost"]["tokens_per_task"] for p in pts], [p["quality"]["SR"] for p in pts],
                       marker=markers[i % len(markers)], label=strategy, s=50)
            for p in pts:
                ax.annotate(p["suite"], (p["cost"]["tokens_per_task"], p["quality"]["SR"]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
        tokens = out / "tokens_vs_success.png"
        save_tokens_vs_sr(fig, ax, tokens, "tokens per task (prompt + completion)", "SR (%)")
        drawn.append(tokens)
    if max((len(p["by_depth"]) for p in summary["pairs"]), default=0) > 1:
        drawn.append(per_suite("tokens_by_depth.png", "tokens of subtask k", " (dashed: uncached prompt)",
                               token_lines))
    return drawn


def save_tokens_vs_sr(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str) -> None:
    """The tokens-against-SR figure's frame (a suite's report, the models' comparison), written to ``path``."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(-5, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


FIGURES = ("accuracy_by_depth.png", "tokens_vs_success.png", "tokens_by_depth.png")


def write_report(rows: Sequence[TaskRow], config: EvalConfig) -> dict[str, Any]:
    """Write summary.json, report.md and (with matplotlib: the ``plots`` extra) the figures into ``config.out``;
    return the summary."""
    summary = summarize(rows, config)
    (config.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    drawn = [path.name for path in figures(summary, config.out)] if plots_available() else []
    (config.out / "report.md").write_text(markdown(summary, drawn))
    return summary


def plots_available() -> bool:
    """Whether the figures can be drawn (matplotlib, the ``plots`` extra, is installed)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
