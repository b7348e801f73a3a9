"""What a GPU pays: the roofline's decode and attention weights, prefill-equivalent tokens, and the report's columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowstate.eval.calls import read
from flowstate.eval.gpu import GPUS, GPUCost, load, roofline
from flowstate.eval.kv import load as load_kv


def test_a_dense_model_decodes_at_weights_over_batch_against_compute_bound_prefill() -> None:
    h200 = GPUS["h200"]
    prefill = 2 * 27e9 / (h200["bf16_tflops"] * 1e12)
    fixed = load_kv("qwen3.5-27b").fixed_state_bytes
    decode = (27e9 * 2 / 32 + fixed) / (h200["bandwidth_tb_s"] * 1e12)
    cost = load("qwen3.5-27b@h200:32")
    assert cost.w == pytest.approx(decode / prefill)
    assert cost.kappa == pytest.approx(65_536 / (h200["bandwidth_tb_s"] * 1e12) / prefill)
    assert load("qwen3.5-27b@h200:8").w > 3.5 * cost.w  # a smaller batch shares each weight read among fewer tokens


def test_an_moe_model_reads_the_experts_its_batch_touches() -> None:
    model = load_kv("qwen3.5-35b-a3b")
    compute = {"params_billion": 35, "active_billion": 3, "expert_billion": 32.21, "experts": 256, "top_k": 8}
    w1, _ = roofline(model, compute, "h200", 1)
    w32, _ = roofline(model, compute, "h200", 32)
    w_all, _ = roofline(model, {**compute, "top_k": 256}, "h200", 32)  # every expert touched: dense weights
    # a single token reads its 8 of 256 experts for itself alone; batch 32 shares what it touches (about 64% of the
    # experts), less than every expert would be
    assert w32 < w1 and w32 < w_all
    assert load("qwen3.5-35b-a3b@h200:32").w == pytest.approx(w32)


def test_pet_weights_decoded_tokens_shares_the_fixed_prefix_and_prefills_forced_tokens() -> None:
    cost = GPUCost("toy", w=3.0, kappa=0.001, source="")
    # [prompt, cached, completion, ttft, decode, shared, forced]
    first = [1000, 0, 100, 0.0, 0.0, 800, 40]  # a session's first call: its system message is on the server already
    later = [1500, 1100, 50, 0.0, 0.0, 800, 0]
    figures = cost.pet([read(first), read(later)])
    assert figures["shared_uncached"] == (1000 - 800) + (1500 - 1100)
    assert figures["forced"] == 40 and figures["decoded"] == 60 + 50
    attended = 60 * (1000 + 50) + 50 * (1500 + 25)
    assert figures["pet"] == pytest.approx(600 + 40 + 3 * 110 + 0.001 * attended)
    # a row of an older run: nothing shared, nothing forced
    assert cost.pet([read(first[:5])])["shared_uncached"] == 1000


@pytest.mark.parametrize("spec", ["qwen3.5-27b", "qwen3.5-27b@a100:8", "qwen3.5-27b@h200", "qwen3.5-27b@h200:0",
                                  "nope@h200:8"])
def test_a_malformed_gpu_cost_is_one_clear_error(spec: str) -> None:
    with pytest.raises(ValueError, match="gpu-cost|kv-model"):
        load(spec)


def test_a_given_decode_weight_replaces_the_rooflines() -> None:
    cost = load("qwen3.5-27b@h200:32", decode_weight=3)
    assert cost.w == 3 and cost.kappa == load("qwen3.5-27b@h200:32").kappa and "given" in cost.label
    with pytest.raises(ValueError, match="positive"):
        load("qwen3.5-27b@h200:32", decode_weight=0)


def test_the_embedded_vocabulary_counts_what_each_calls_grammar_forces() -> None:
    """The reference policies' outputs, counted in SmolLM2's tokens: a four-block output's tags, keys and empty
    blocks are forced by its grammar; free text (a summary, an answer) is not; text outside the grammar stops it."""
    from engine.llamacpp import Vocabulary
    from flowstate.constrain import GrammarMode, Grammars
    from flowstate.protocol import ModelOutput, render_output

    vocab = Vocabulary()
    grammar = Grammars([], GrammarMode.STATIC).static
    assert grammar is not None
    empty = render_output(ModelOutput.model_validate({"assistant_message": {"content": "Hi"}}))
    wordy = render_output(ModelOutput.model_validate({"assistant_message": {"content": "Hi " * 40}}))
    tokens, forced = len(vocab(empty)), vocab.forced(grammar, empty)
    assert 0.5 * tokens < forced < tokens  # all but the answer's text is structure
    # a longer answer adds decoded tokens, not forced ones (but for where its last token meets the closing quote)
    assert len(vocab(wordy)) - tokens >= 40 and abs(vocab.forced(grammar, wordy) - forced) <= 2
    assert vocab.forced(grammar, "not the protocol " + empty) == 0


def test_reports_counted_in_model_tokens_give_forced_tokens(tmp_path: Path) -> None:
    import json as _json

    from flowstate.eval.report import write_report
    from flowstate.eval.runner import EvalConfig, run_eval
    from tests.flowstate.eval.test_replay import conversation

    path = tmp_path / "airline.json"
    path.write_text(_json.dumps([{"task_id": 0, "traj": conversation("mia_li_3668", "ABC123")}]))
    config = EvalConfig(suites=("tau-replay",), strategies=("flowstate", "full-context"), tasks=1, depth=1,
                        out=tmp_path / "ev", policy="realistic", replay=str(path), count_tokens="embedded")
    summary = write_report(run_eval(config, []), config)
    for p in summary["pairs"]:
        g = p["gpu"]
        assert 0 < g["forced_per_task"] < p["cost"]["completion_tokens_per_task"]
        assert g["decoded_per_task"] + g["forced_per_task"] == p["cost"]["completion_tokens_per_task"]


def test_the_perfect_prefix_cache_holds_the_previous_output_too() -> None:
    """A chat that resends the previous call's output verbatim prefills none of it (vLLM keeps the blocks its decode
    fills); an output the next prompt renders differently is not cached."""
    from engine.base import Message
    from engine.text import flatten, tokenize
    from flowstate.eval.policies import PolicyEngine

    replies = iter(["alpha beta gamma delta", "done"])
    engine = PolicyEngine(lambda messages, purpose: next(replies))
    first = [Message("system", "rules"), Message("user", "question")]
    engine.generate(first)
    resent = [*first, Message("assistant", "alpha beta gamma delta"), Message("user", "more")]
    usage = engine.generate(resent).usage
    assert usage.cached_tokens == len(tokenize(flatten(first) + "alpha beta gamma delta"))
    assert usage.prompt_tokens - usage.cached_tokens == len(tokenize("\n<|user|>\nmore\n<|assistant|>\n"))
    replies = iter(["alpha beta gamma delta", "done"])
    engine = PolicyEngine(lambda messages, purpose: next(replies))
    engine.generate(first)
    rewritten = [*first, Message("assistant", "ALPHA beta"), Message("user", "more")]
    assert engine.generate(rewritten).usage.cached_tokens == len(tokenize(flatten(first)))


def test_tokens_are_counted_in_a_gguf_files_vocabulary(tmp_path: Path) -> None:
    """--count-tokens FILE.gguf counts with that file's vocabulary alone: the embedded model's file named by its path
    counts as 'embedded' does, and both differ from counting words; an unknown name is refused."""
    from pathlib import Path as _Path

    import pytest as _pytest

    from engine.transformers import embedded_model
    from flowstate.eval.runner import token_counter

    folder, name = embedded_model()
    text = "Hotel A (Baixa) costs $200 from 2026-09-20; cancellation_fee_usd=80."
    by_file = token_counter(str(_Path(folder) / name))(text)
    assert list(by_file) == list(token_counter("embedded")(text))
    assert len(by_file) != len(token_counter("words")(text))
    with _pytest.raises(ValueError, match="unknown token count"):
        token_counter("tiktoken")


def test_the_calibration_reads_two_runs_figure_by_figure(tmp_path: Path) -> None:
    """bench calibrate: the realistic policy against itself is 1.00 on every figure it measures; against the oracle
    (which records more, discloses less) the ratios differ from 1 and are read from the records."""
    from flowstate.bench.calibration import FIGURES, _records, compare, figures
    from flowstate.eval.runner import EvalConfig, run_eval

    folders = {}
    for policy in ("realistic", "oracle"):
        folders[policy] = tmp_path / policy
        run_eval(EvalConfig(suites=("hotel",), strategies=("flowstate",), tasks=2, depth=3, out=folders[policy],
                            policy=policy), [])
    same = compare(folders["realistic"], folders["realistic"], str.split)
    assert [r["figure"] for r in same] == list(FIGURES)
    assert {r["real / realistic"] for r in same if r["realistic policy"] not in ("–", "0.00")} == {"1.00"}
    real = figures(_records(folders["realistic"], "flowstate"), str.split)
    assert real["states per request"] is not None and real["states per request"] > 0
    assert real["decoded tokens per step"] is not None and real["decoded tokens per step"] > 0
    other = compare(folders["oracle"], folders["realistic"], str.split)
    assert any(r["real / realistic"] not in ("1.00", "–") for r in other)
