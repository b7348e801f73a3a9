"""The llamacpp engine on the real embedded GGUF (SmolLM2-135M-Instruct): outputs parse under the
protocol grammar, the KV prefix is reused, threads share the engine, the id-aware grammar confines what a step may
name, bad input is a clear error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.base import Message, Sampling, Usage
from engine.errors import EngineConfigError
from engine.llamacpp import LlamaCppEngine
from flowstate import Agent, LoopConfig, Repository
from flowstate.bench.decode import hotel_calls
from flowstate.demo import hotel
from flowstate.limits import COMPACT
from flowstate.nodes import Node, StateType
from flowstate.parse import parse_output
from tests.helpers import Recording, check_under_grammar

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama() -> LlamaCppEngine:
    return LlamaCppEngine()


@pytest.fixture(scope="module")
def calls() -> list[tuple[list[Message], str | None]]:
    return hotel_calls(COMPACT)[0]


def test_outputs_parse_under_the_grammar_and_the_prefix_is_reused(llama: LlamaCppEngine, calls) -> None:
    assert llama.capabilities.embedded and llama.context == 8192
    gens = [llama.generate(messages, grammar=grammar) for messages, grammar in calls[:3]]
    for (_, grammar), gen in zip(calls, gens, strict=False):
        # whatever the 135M model writes (greedy decoding differs between CPUs): only the grammar's tokens, and a
        # whole output parses
        check_under_grammar(grammar or "", gen, COMPACT)
        assert gen.usage.completion_tokens > 0 and gen.usage.ttft_s > 0 and gen.usage.decode_s > 0
        assert gen.usage.mask_s > 0  # the grammar's masks, timed (flowstate bench decode reports them per token)
    # calls 2 and 3 continue the request: their prompts start with the previous call's prompt
    assert gens[1].usage.cached_tokens > 1000 and gens[2].usage.cached_tokens > 1000
    assert gens[1].usage.cached_tokens < gens[1].usage.prompt_tokens
    # the four blocks' tags, keys and empty blocks are forced: appended in one pass, not decoded one by one
    assert all(0 < g.usage.forced_tokens < g.usage.completion_tokens for g in gens)
    assert all(0.2 * g.usage.completion_tokens < g.usage.forced_tokens for g in gens if not g.truncated)


def test_fast_forward_appends_the_forced_tokens_and_changes_no_token() -> None:
    """Greedy, batch size 1 (so both ways compute every token in the same batch shape): the same text and token
    count with forced tokens appended as without; only how many tokens were decoded one step each differs."""
    from flowstate.constrain import GrammarMode, Grammars

    grammar = Grammars([], GrammarMode.STATIC, limits=COMPACT).static
    messages = [Message("system", "Answer in the four blocks."), Message("user", "Say hello to Ana.")]
    engine = LlamaCppEngine(batch_size=1)
    gens = {}
    for fast in (False, True):
        engine.fast_forward = fast
        engine.llm.reset()
        gens[fast] = engine.generate(messages, grammar=grammar, max_tokens=120)
    assert gens[True].text == gens[False].text
    assert gens[True].usage.completion_tokens == gens[False].usage.completion_tokens
    assert gens[False].usage.forced_tokens == 0 and gens[True].usage.forced_tokens > 10


def test_a_call_cut_at_its_budget_is_truncation(llama: LlamaCppEngine, calls) -> None:
    messages, grammar = calls[0]
    gen = llama.generate(messages, grammar=grammar, max_tokens=5)
    assert gen.truncated and gen.usage.completion_tokens == 5
    assert llama.generate(messages, max_tokens=5).usage.mask_s == 0  # no grammar, no mask


def test_threads_share_the_engine_safely(llama: LlamaCppEngine, calls) -> None:
    jobs = [calls[0], calls[3], calls[0], calls[3]]
    with ThreadPoolExecutor(4) as pool:
        gens = list(pool.map(lambda c: llama.generate(c[0], grammar=c[1], max_tokens=400), jobs))
    for (_, grammar), gen in zip(jobs, gens, strict=True):  # one call at a time: nothing mixed into another's output
        check_under_grammar(grammar or "", gen, COMPACT)
        assert 0 < gen.usage.completion_tokens <= 400
    assert gens[0].usage.prompt_tokens == gens[2].usage.prompt_tokens  # each prompt tokenized whole, once
    # (outputs of the same prompt may differ: a prompt served partly from the KV cache is computed in other
    # batch shapes than a fresh one, and a 135M model's greedy path is sensitive to that)


def test_bad_input_is_a_clear_error(llama: LlamaCppEngine, tmp_path) -> None:
    with pytest.raises(EngineConfigError, match="is not a .gguf file"):
        LlamaCppEngine(str(tmp_path / "missing.gguf"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(EngineConfigError, match="cannot load"):
        LlamaCppEngine(str(broken))
    with pytest.raises(EngineConfigError, match="grammar refused"):
        llama.generate([Message("user", "hi")], grammar='start: %json {"type": "object", "propertyNames": {}}')


def test_template_kwargs_reach_the_template() -> None:
    from tests.engine.test_chat import MESSAGES, QWEN_STYLE

    thinking = LlamaCppEngine(chat_template=QWEN_STYLE)
    plain = LlamaCppEngine(chat_template=QWEN_STYLE, chat_template_kwargs={"enable_thinking": False})
    assert thinking.render(MESSAGES).endswith("<think>\n") and "<think>" not in plain.render(MESSAGES)


def test_id_aware_grammar_confines_state_focus(llama: LlamaCppEngine) -> None:
    engine = Recording(llama)
    with Repository.open(":memory:") as repo:
        def state(node_id: str, summary: str) -> Node:
            return Node(id=node_id, type=StateType.JUDGEMENT, summary=summary, value={"note": summary}, request=1)
        repo.persist_request("s", 1, "Book hotel A and remember my budget", "Booked A.",
                             [state("dec_book_a", "Booked hotel A for $200"), state("pref_budget", "Budget is $250")],
                             {})
        repo.persist_request("other", 1, "secret", "ok", [state("secret_plan", "another session's plan")], {})
        agent = Agent(engine, repository=repo, session="s", tools=hotel.TOOLS, task_policy=hotel.POLICY,
                      config=LoopConfig(max_steps=2, max_protocol_errors=1))
        record = agent.run("Look at secret_plan, obs_r1_s1_1 and dec_book_a: what did I book and what is my budget?")
        assert record.unfinished is None and record.response  # the last allowed step answers
    for _, grammar, gen in engine.calls:
        output = parse_output(gen.text)
        assert {f.target_id for f in output.state_focus} <= {"dec_book_a", "pref_budget"}
        assert grammar is not None and "secret_plan" not in grammar


def test_speculation_without_a_kept_draft_is_the_one_token_path(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drafting loop's own bookkeeping (the KV cache, the penalty's context, the grammar's mask, forced tokens)
    changes no token: with no draft to verify it writes exactly what the one-token path writes."""
    from engine import lookup

    plain, drafting = LlamaCppEngine(), LlamaCppEngine(speculate="lookup:4")
    monkeypatch.setattr(lookup.Lookup, "propose", lambda self, limit=None: [])
    for messages, grammar in calls[:1]:  # one whole call under its grammar (forced runs, penalty, end) is enough
        a, b = plain.generate(messages, grammar=grammar), drafting.generate(messages, grammar=grammar)
        assert (b.text, b.usage.completion_tokens, b.usage.forced_tokens) == (a.text, a.usage.completion_tokens,
                                                                             a.usage.forced_tokens)
        assert b.usage.drafted_tokens == 0


def test_speculation_drafts_from_the_prompt_and_every_output_parses(calls) -> None:
    """lookup:4 on the hotel prompts: drafts come (a FlowState output copies ids and values from its prompt), some
    are kept, each call says how many; greedy and sampled outputs stay under the grammar."""
    engine = LlamaCppEngine(speculate="lookup:4")
    gens = [engine.generate(messages, grammar=grammar) for messages, grammar in calls[:2]]
    gens.append(engine.generate(calls[0][0], grammar=calls[0][1], sampling=Sampling(temperature=0.8, top_p=0.95,
                                                                                      seed=3)))
    for (_, grammar), gen in zip([*calls[:2], calls[0]], gens, strict=True):
        check_under_grammar(grammar or "", gen, COMPACT)
        assert 0 <= gen.usage.accepted_tokens <= gen.usage.drafted_tokens
        assert gen.usage.accepted_tokens + gen.usage.forced_tokens <= gen.usage.completion_tokens
    assert sum(g.usage.drafted_tokens for g in gens) > 20 and sum(g.usage.accepted_tokens for g in gens) > 5
    total = sum((g.usage for g in gens), Usage()).to_dict()  # what a run record shows of them
    assert total["drafted_tokens"] >= total["accepted_tokens"] > 0


def test_speculation_needs_a_batch_that_holds_the_draft() -> None:
    with pytest.raises(EngineConfigError, match="batch_size must exceed 4"):
        LlamaCppEngine(speculate="lookup:4", batch_size=4)
    with pytest.raises(EngineConfigError, match="speculate takes lookup:K"):
        LlamaCppEngine(speculate="ngram:4")


def test_a_salted_call_never_reuses_or_reports_another_salts_prefix(llama: LlamaCppEngine, calls) -> None:
    """The side channel, shown open and then closed (issue 67): without salts a second caller sending the first
    one's prompt is told it was cached (cached_tokens ~ the whole prompt); with a salt of its own it is told 0 and
    prefills it all; its own next call reuses its own prefix as before."""
    messages, _ = calls[0]
    budget = 4
    llama.generate(messages, max_tokens=budget)
    shared = llama.generate(messages, max_tokens=budget).usage  # no salts: one partition, everyone's
    assert shared.cached_tokens >= shared.prompt_tokens - 1
    llama.generate(messages, max_tokens=budget, cache_salt="tenant-a")
    other = llama.generate(messages, max_tokens=budget, cache_salt="tenant-b").usage
    assert other.cached_tokens == 0 and other.prompt_tokens == shared.prompt_tokens
    again = llama.generate(messages, max_tokens=budget, cache_salt="tenant-b").usage
    assert again.cached_tokens >= again.prompt_tokens - 1  # within a tenant, the prefix is reused as before
    assert llama.generate(messages, max_tokens=budget).usage.cached_tokens == 0  # unsalted after salted: no hit
    assert llama.capabilities.salts


def test_the_shared_system_prompt_is_reused_across_salts_and_nothing_past_it(llama: LlamaCppEngine, calls) -> None:
    """With the deployment's system prompt declared shared, a tenant's first call reuses that much of another
    tenant's cache — a prefix it sent itself — and never a token past it, even sending the other's very prompt."""
    messages, _ = calls[0]
    system, budget = messages[0], 4
    try:
        llama.share_prefix([system])
        shared = len(llama._shared)
        assert 0 < shared <= llama.count_tokens(system.content) + 8
        llama.generate(messages, max_tokens=budget, cache_salt="tenant-a")
        other = llama.generate(messages, max_tokens=budget, cache_salt="tenant-b").usage
        assert other.cached_tokens == shared < other.prompt_tokens - 1
        own = llama.generate(messages, max_tokens=budget, cache_salt="tenant-b").usage
        assert own.cached_tokens >= own.prompt_tokens - 1
        elsewhere = [system, Message("user", "Something else entirely.")]
        assert llama.generate(elsewhere, max_tokens=budget, cache_salt="tenant-c").usage.cached_tokens == shared
    finally:
        llama._shared = []
    assert llama.capabilities.shares and llama.capabilities.priority
