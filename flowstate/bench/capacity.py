"""``flowstate bench capacity FILE --kv-tokens T``: how many of a method's sessions fit in a fixed KV cache,
decided by vLLM's own scheduler.

An evaluation's recorded model calls (``flowstate eval --trace``) are fed, N sessions at once, to vLLM's v1
``Scheduler`` and its KV-cache manager running in this process: block allocation, prefix caching (the block hashes
of the prompts' real token ids), chunked prefill, admission and preemption are vLLM's code. Only the forward pass
is left out: each scheduled step "samples" one placeholder token per request whose prompt is in, and every output
is forced to its recorded length, as ``flowstate bench trace`` forces it on a server. A session's next call is
submitted the step after its previous one ends (clients that answer at once, the busiest case). No model runs, so
contexts far beyond a CPU's reach, and a GPU's KV budget, are measured in seconds.

With ``fast_forward`` the tokens each call's grammar forced (recorded in the trace) are appended the step a token
is sampled, as an engine that fast-forwards does: the next step computes them with the sampled one, as a chunk at
prefill cost, instead of one decode step each. vLLM 0.32 does not (its guidance backend leaves jump decoding as a
TODO); FlowState's llamacpp engine does. Which of a call's steps the forced tokens follow is not recorded: they
are spread evenly over its sampled tokens (what a step computes shifts; how many steps a call takes does not).

A trace holds tens of sessions; ``reuse`` takes N past them with distinct copies (``copies``).

What this leaves out, said where the figures are reported: time (a step is one forward pass, whatever it holds),
the fixed per-session state of hybrid models' linear-attention layers, and the prefix hits a model's own decoded
tokens would give the next prompt (placeholder tokens never match; ``bench trace`` on a server has the same gap).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from engine.lookup import Speculation
from flowstate.bench.drafting import Drafter, Propose, Tally, vllm_ngram
from flowstate.bench.table import table
from flowstate.eval.metrics import percentile
from flowstate.eval.steptime import Step, StepTime
from flowstate.eval.trace import TracedCall

PLACEHOLDER = 7
"""The token every simulated step 'samples' (its value does not matter: outputs end at their recorded length)."""


class ScheduledCall(NamedTuple):
    """One call as the scheduler gets it: its prompt's token ids, its output's length and how many of those tokens
    its grammar forced, (to replay drafting) the output's token ids, and the cache salt and priority it is sent
    with."""

    ids: list[int]
    output: int
    forced: int = 0
    output_ids: tuple[int, ...] = ()
    salt: str | None = None
    priority: int = 0


def appended(output: int, forced: int) -> list[int]:
    """The forced tokens appended after each of a call's sampled tokens, spread evenly: one entry per sampled
    token (at least one), summing with them to ``output``."""
    sampled = max(output - forced, 1)
    extra = max(output, 1) - sampled
    return [extra // sampled + (i < extra % sampled) for i in range(sampled)]


@dataclass(frozen=True)
class Budget:
    kv_tokens: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192  # vLLM's chunked-prefill token budget per step (its GPU serving default)
    max_num_seqs: int = 256

    @property
    def blocks(self) -> int:
        return self.kv_tokens // self.block_size


class Tokenizer:
    """A call's prompt as the server would tokenize it: the model's chat template with the generation prompt."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))
        self._systems: dict[str, list[int]] = {}

    def _ids(self, messages: Sequence[Any], generation: bool) -> list[int]:
        text = self._tok.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                             add_generation_prompt=generation, tokenize=False)
        return list(self._tok.encode(str(text), add_special_tokens=False))

    def __call__(self, call: TracedCall) -> list[int]:
        return self._ids(call.messages, True)

    def text(self, text: str) -> list[int]:
        """A text's token ids as the model decodes it (an output, no special tokens added)."""
        return list(self._tok.encode(text, add_special_tokens=False))

    def shared(self, call: TracedCall, ids: list[int]) -> int:
        """How many of the prompt's first tokens are its system message (what every session of a deployment
        shares); 0 without one."""
        if not call.messages or call.messages[0].role != "system":
            return 0
        key = call.messages[0].content
        if key not in self._systems:
            self._systems[key] = self._ids(call.messages[:1], False)
        system = self._systems[key]
        if ids[: len(system)] != system:
            raise ValueError("the chat template does not render the system message as the prompt's first tokens")
        return len(system)


def tokenizer(model_dir: str | Path) -> Tokenizer:
    return Tokenizer(model_dir)


MARKER = 1000
"""Copy k of a session carries token ``MARKER + k`` after its system message (any id: only block hashes see it)."""


def copies(sessions: list[list[ScheduledCall]], shared: list[list[int]], n: int) -> list[list[ScheduledCall]]:
    """``n`` sessions from fewer recorded ones, reused in turn: copy k (k ≥ 1) of a session carries one token of its
    own right after the system message in every call, so copies share the system prompt, as different
    conversations do, and nothing after it, while a copy's calls share their prefixes with each other as the
    original's do."""
    out = []
    for i in range(n):
        k, j = divmod(i, len(sessions))
        out.append(sessions[j] if k == 0 else
                   [c._replace(ids=c.ids[:m] + [MARKER + k] + c.ids[m:])
                    for c, m in zip(sessions[j], shared[j], strict=True)])
    return out


class SimulatedTiming:
    """The simulated clock of one run: each step's roofline time, and every request's submit, first token and end."""

    def __init__(self) -> None:
        self.now = 0.0
        self.compute_bound = 0
        self.steps = 0
        self._submitted: dict[str, float] = {}
        self._first: dict[str, float] = {}
        self.latency: list[float] = []  # per call: submit to last token
        self.ttft: list[float] = []  # per call: submit to first token

    def submitted(self, rid: str) -> None:
        self._submitted[rid] = self.now

    def step(self, clock: StepTime, scheduled: dict[str, int], requests: dict[str, Any], sampling: list[str]) -> None:
        work = Step()
        for rid, n in scheduled.items():
            req = requests[rid]
            after = req.num_computed_tokens  # the scheduler advanced it when it scheduled the step
            before = after - n
            decode = int(n == 1 and before >= req.num_prompt_tokens)
            work = Step(work.prefill + n - decode, work.decode + decode, work.context + after,
                        work.attended + n * before + n * (n + 1) // 2, work.sequences + 1)
        self.now += clock.seconds(work)
        self.steps += 1
        compute, memory = clock.roofs(work)
        self.compute_bound += compute >= memory
        for rid in sampling:
            if rid not in self._first:
                self._first[rid] = self.now
                self.ttft.append(self.now - self._submitted[rid])

    def finished(self, rid: str) -> None:
        self.latency.append(self.now - self._submitted.pop(rid))
        self._first.pop(rid, None)

    def figures(self, sessions: int) -> dict[str, Any]:
        return {"seconds": round(self.now, 2),
                "sessions_per_hour": round(sessions * 3600 / self.now, 1) if self.now else None,
                "call_p50_s": round(percentile(self.latency, 50), 2),
                "call_p99_s": round(percentile(self.latency, 99), 2),
                "ttft_p50_s": round(percentile(self.ttft, 50), 3), "ttft_p99_s": round(percentile(self.ttft, 99), 3),
                "compute_bound_steps": round(self.compute_bound / max(self.steps, 1), 3)}


class Simulation:
    """vLLM's scheduler over one KV budget; ``run`` replays sessions on a fresh one."""

    def __init__(self, model_dir: str | Path, budget: Budget) -> None:
        # The config is read for its shape only; no weights load and nothing runs at any position, so a context
        # longer than the model's trained window is allowed (the replay forces every output's length).
        os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        self.budget = budget
        max_len = budget.blocks * budget.block_size
        self.config = VllmConfig(
            scheduler_config=SchedulerConfig(max_num_seqs=budget.max_num_seqs, max_model_len=max_len,
                                             max_num_batched_tokens=budget.max_num_batched_tokens,
                                             enable_chunked_prefill=True, is_encoder_decoder=False),
            model_config=ModelConfig(model=str(model_dir), max_model_len=max_len, skip_tokenizer_init=True),
            cache_config=CacheConfig(block_size=budget.block_size, enable_prefix_caching=True))
        self.config.cache_config.num_gpu_blocks = budget.blocks
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(budget.block_size, hash_fn)

    def _config(self, speculation: Speculation | None) -> Any:
        """The config, with ``speculation`` vLLM's own speculative config (the scheduler sizes its drafts by it)."""
        if speculation is None:
            return self.config
        from dataclasses import replace as replaced

        from vllm.config import ParallelConfig, SpeculativeConfig

        spec = SpeculativeConfig(**speculation.vllm_config(), target_model_config=self.config.model_config,
                                 target_parallel_config=ParallelConfig())
        return replaced(self.config, speculative_config=spec)

    def scheduler(self, speculation: Speculation | None = None) -> Any:
        import torch
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        # One full-attention group: what the manager counts is blocks; the bytes behind a block are the budget's
        spec = FullAttentionSpec(block_size=self.budget.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        kv = KVCacheConfig(num_blocks=self.budget.blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["attention"], spec)])
        config = self._config(speculation)
        return Scheduler(vllm_config=config, kv_cache_config=kv, block_size=self.budget.block_size,
                         structured_output_manager=StructuredOutputManager(config), log_stats=True)

    def _check_fits(self, sessions: Sequence[Sequence[ScheduledCall]]) -> None:
        longest = max((len(c.ids) + c.output for calls in sessions for c in calls), default=0)
        if longest > self.budget.blocks * self.budget.block_size:
            raise ValueError(f"a call needs {longest} tokens of KV cache; the budget holds "
                             f"{self.budget.blocks * self.budget.block_size} (raise --kv-tokens)")

    def _waited_for_kv(self, sched: Any, scheduled: int) -> bool:
        """A request left waiting though the step had tokens and seats to spare waited for KV blocks."""
        return bool(sched.waiting) and scheduled < self.budget.max_num_batched_tokens \
            and len(sched.running) < self.budget.max_num_seqs

    def run(self, sessions: Sequence[Sequence[ScheduledCall]], clock: StepTime | None = None,
            fast_forward: bool = False, speculation: Speculation | None = None) -> dict[str, Any]:
        """Sessions (each its calls in order) all at once; what the scheduler did, and with ``clock`` how long it
        took (each step's roofline time, summed). ``fast_forward``: forced tokens are appended, not decoded.
        ``speculation``: each decode step verifies the draft vLLM's n-gram proposer makes (``drafting``)."""
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        if speculation is not None and fast_forward:
            raise ValueError("speculation replays vLLM, which does not fast-forward: give --speculate or "
                             "--fast-forward, not both")
        sched = self.scheduler(speculation)
        self._check_fits(sessions)
        timing = SimulatedTiming()
        feed = _Feed(sched, [list(calls) for calls in sessions], self.hasher, fast_forward, timing,
                     vllm_ngram(speculation) if speculation else None, speculation.k if speculation else 0)
        live = feed.live
        for i, queue in enumerate(feed.queues):
            if queue:
                feed.submit(i)
        steps = computed = output = preemptions = hits = queries = peak_waiting = kv_waits = forced = 0
        peak_usage = 0.0
        while live:
            plan = sched.schedule()
            steps += 1
            peak_usage = max(peak_usage, sched.kv_cache_manager.usage)
            peak_waiting = max(peak_waiting, len(sched.waiting))
            ids_ = list(plan.num_scheduled_tokens)
            scheduled = sum(plan.num_scheduled_tokens.values())
            computed += scheduled
            kv_waits += self._waited_for_kv(sched, scheduled)
            sampled = [[PLACEHOLDER] * feed.yielded(r, len(plan.scheduled_spec_decode_tokens.get(r, ())))
                       if live[r][1].num_computed_tokens >= live[r][1].num_tokens else [] for r in ids_]
            forced += sum(max(len(out) - 1, 0) for out in sampled)
            if clock is not None:
                timing.step(clock, plan.num_scheduled_tokens, {r: live[r][1] for r in ids_},
                            [r for r, out in zip(ids_, sampled, strict=True) if out])
            result = sched.update_from_output(plan, ModelRunnerOutput(
                req_ids=ids_, req_id_to_index={r: j for j, r in enumerate(ids_)}, sampled_token_ids=sampled))
            step_hits, step_queries = _prefix_stats(result)
            hits, queries = hits + step_hits, queries + step_queries
            for rid, (session, req) in list(live.items()):
                if req.is_finished():
                    timing.finished(rid)
                    feed.finished(rid)
                    preemptions += req.num_preemptions
                    output += req.num_output_tokens
                    if feed.queues[session]:
                        feed.submit(session)
            if feed.drafters:
                drafts = {r: [PLACEHOLDER] * d.draft() for r, d in feed.drafters.items()}
                sched.update_draft_token_ids(DraftTokenIds(list(drafts), list(drafts.values())))
        return {"sessions": len(sessions), "calls": feed.made, "steps": steps, "computed_tokens": computed,
                # appended: the forced tokens fast-forwarded (with drafts, what they kept is kept_tokens, not this)
                "output_tokens": output, "appended_tokens": 0 if speculation else forced,
                "peak_kv_usage": round(peak_usage, 3), "peak_waiting": peak_waiting,
                "kv_wait_steps": kv_waits, "prefix_hit_rate": round(hits / queries, 3) if queries else None,
                "preemptions": preemptions,
                **(feed.tally.figures() if speculation else {}),
                **(timing.figures(len(sessions)) if clock is not None else {})}


@dataclass
class _Feed:
    """Each session's calls fed to the scheduler in turn: its next call once the one before has finished."""

    sched: Any
    queues: list[list[ScheduledCall]]
    hasher: Any
    fast_forward: bool
    timing: SimulatedTiming
    propose: Propose | None = None  # drafting replayed (``drafting``), drafts of up to ``k`` tokens
    k: int = 0
    live: dict[str, tuple[int, Any]] = field(default_factory=dict)  # request id -> (session, request)
    extra: dict[str, list[int]] = field(default_factory=dict)  # per request, forced tokens still to append
    drafters: dict[str, Drafter] = field(default_factory=dict)
    forced: dict[str, int] = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)
    made: int = 0

    def yielded(self, rid: str, verified: int) -> int:
        """The tokens a request's step yields: one, the forced tokens appended after it, or what its draft kept."""
        if rid in self.drafters:
            return self.drafters[rid].advance(verified)
        return 1 + (self.extra[rid].pop() if self.extra[rid] else 0)

    def finished(self, rid: str) -> None:
        del self.live[rid], self.extra[rid]
        if rid in self.drafters:
            self.tally.add(self.drafters.pop(rid), self.forced.pop(rid))

    def submit(self, session: int) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        rid = f"{session}-{self.made}"
        self.timing.submitted(rid)
        call = self.queues[session].pop(0)
        n = max(call.output, 1)
        req = Request(request_id=rid, prompt_token_ids=call.ids, pooling_params=None,
                      sampling_params=SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True),
                      block_hasher=self.hasher, cache_salt=call.salt, priority=call.priority)
        self.extra[rid] = appended(n, call.forced)[::-1] if self.fast_forward else []
        if self.propose is not None:
            if len(call.output_ids) != n:
                raise ValueError("replaying drafting needs each call's output token ids (--speculate reads them "
                                 "from the trace's outputs)")
            self.drafters[rid], self.forced[rid] = Drafter(call.ids, call.output_ids, self.k, self.propose), call.forced
        self.made += 1
        self.live[rid] = (session, req)
        self.sched.add_request(req)


def _prefix_stats(result: dict[Any, Any]) -> tuple[int, int]:
    """The prefix-cache hits and queries the scheduler reported for one step."""
    hits = queries = 0
    for out in result.values():
        stats = out.scheduler_stats.prefix_cache_stats if out.scheduler_stats else None
        if stats is not None:
            hits, queries = hits + stats.hits, queries + stats.queries
    return hits, queries


FF = " +ff"
"""The suffix of a method's rows whose forced tokens were fast-forwarded."""


def bench_capacity(traces: dict[str, dict[str, list[TracedCall]]], tokenize: Tokenizer, simulation: Simulation,
                   concurrency: Sequence[int], progress: Callable[[str], None] = lambda _: None,
                   clock: StepTime | None = None, fast_forward: Sequence[bool] = (False,),
                   reuse: bool = False, speculate: Sequence[Speculation | None] = (None,)) -> list[dict[str, Any]]:
    """Each method's first N sessions at once, for each N (no more than the trace holds, or with ``reuse`` distinct
    copies of its sessions in turn: ``copies``), on a fresh scheduler; once per ``fast_forward`` setting (rows of
    forced tokens appended are named ``METHOD +ff``) and per ``speculate`` setting (rows of drafts verified are
    named ``METHOD ngram:K``; with any, every row's outputs are the trace's texts as ``tokenize`` encodes them)."""
    modes = [(ff, sp) for ff in fast_forward for sp in speculate]
    if any(ff and sp for ff, sp in modes):
        raise ValueError("--speculate replays vLLM, which does not fast-forward: give it with --fast-forward off")
    rows = []
    for strategy, sessions in traces.items():
        calls = [[_call(c, tokenize, any(speculate)) for c in s] for s in sessions.values()]
        shared = [[tokenize.shared(t, c.ids) for t, c in zip(s, cs, strict=True)]
                  for s, cs in zip(sessions.values(), calls, strict=True)] if reuse else []
        if True in fast_forward and not any(c.forced for s in calls for c in s):
            raise ValueError(f"the trace records no forced tokens for {strategy} (record it with --count-tokens "
                             "embedded, whose vocabulary counts what each call's grammar forces)")
        for ff, sp in modes:
            name = strategy + (FF if ff else "") + (f" {sp}" if sp else "")
            for n in concurrency:
                if n > len(calls) and not reuse:
                    progress(f"{name}: the trace holds {len(calls)} sessions, not {n} (--reuse-sessions)")
                    continue
                progress(f"{name}: {n} sessions at once")
                batch = copies(calls, shared, n) if n > len(calls) else calls[:n]
                rows.append({"strategy": name, **simulation.run(batch, clock, ff, sp)})
    return rows


def _call(call: TracedCall, tokenize: Tokenizer, outputs: bool) -> ScheduledCall:
    """A traced call as the scheduler gets it; with ``outputs`` its output's token ids too (its length theirs)."""
    if not outputs:
        return ScheduledCall(tokenize(call), call.completion_tokens, call.forced_tokens)
    if call.output is None:
        raise ValueError("the trace keeps no outputs (recorded before they were kept): record it again with "
                         "flowstate eval --trace to replay drafting")
    ids = tuple(tokenize.text(call.output)) or (PLACEHOLDER,)
    return ScheduledCall(tokenize(call), len(ids), min(call.forced_tokens, len(ids)), ids)


def sustained(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Per method, the largest N measured below which (N included) no request was preempted or waited for KV."""
    out: dict[str, int] = {}
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        best = 0
        for r in sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["sessions"]):
            if r["preemptions"] or r["kv_wait_steps"]:
                break
            best = r["sessions"]
        out[strategy] = best
    return out


def best(rows: list[dict[str, Any]], slo_s: float | None = None) -> dict[str, tuple[int, float]]:
    """Per method, the N whose sessions per hour are highest, and that rate (with ``slo_s``: among the N whose p99
    time per call is within it — the goodput; (0, 0.0) where none is)."""
    out: dict[str, tuple[int, float]] = {}
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        timed = [r for r in rows if r["strategy"] == strategy and r.get("sessions_per_hour") is not None
                 and (slo_s is None or r["call_p99_s"] <= slo_s)]
        top = max(timed, key=lambda r: r["sessions_per_hour"], default=None)
        out[strategy] = (top["sessions"], top["sessions_per_hour"]) if top else (0, 0.0)
    return out


HEAD = ["strategy", "sessions", "calls", "steps", "computed_tokens", "output_tokens", "appended_tokens",
        "peak_kv_usage", "peak_waiting",
        "kv_wait_steps", "prefix_hit_rate", "preemptions"]
DRAFTED = ["drafted_tokens", "kept_tokens", "kept_share", "tokens_per_step", "copied_share", "free_share",
           "forced_share"]
TIMED = ["seconds", "sessions_per_hour", "call_p50_s", "call_p99_s", "ttft_p50_s", "ttft_p99_s", "compute_bound_steps"]


def render_table(rows: list[dict[str, Any]], slo_s: float = 10.0) -> str:
    most = ", ".join(f"{s} {n}" for s, n in sustained(rows).items())
    timed = any("seconds" in r for r in rows)
    head = HEAD + (DRAFTED if any("drafted_tokens" in r for r in rows) else []) + (TIMED if timed else [])
    out = table(head, rows) + f"\n\nMost sessions at once, none preempted or kept waiting for KV: {most}"
    if timed:
        top = ", ".join(f"{s} {v:g} (N = {n})" for s, (n, v) in best(rows).items())
        good = ", ".join(f"{s} {v:g} (N = {n})" for s, (n, v) in best(rows, slo_s).items())
        out += f"\nMost sessions per GPU-hour: {top}\nGoodput, p99 time per call within {slo_s:g} s: {good}"
    return out
