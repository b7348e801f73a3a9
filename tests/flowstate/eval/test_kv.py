"""The KV-cache footprint per session: bytes per token from config.json fields, hybrid models, sessions that fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowstate.eval.kv import GIB, footprint, from_config, load
from flowstate.eval.rows import TaskRow
from tests.helpers import task_row


def test_bytes_per_token_from_a_dense_config() -> None:
    llama = load("llama-3.1-8b")  # 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes
    assert llama.bytes_per_token == 131_072 and llama.fixed_state_bytes == 0
    assert "meta-llama" in llama.source


def test_a_hybrid_model_keeps_a_growing_cache_only_in_full_attention_layers() -> None:
    qwen = load("qwen3.5-9b")  # 8 of 32 layers full attention: 2 x 8 x 4 x 256 x 2
    assert qwen.kv_layers == 8 and qwen.bytes_per_token == 32_768
    assert qwen.fixed_state_bytes == 24 * 32 * 128 * 128 * 2  # the linear-attention layers' state, per session
    explicit = from_config({"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                            "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
                            "torch_dtype": "float32"}, "toy")
    assert explicit.kv_layers == 2 and explicit.bytes_per_token == 2 * 2 * 2 * 64 * 4


def test_any_config_json_with_its_weights_and_sessions_that_fit(tmp_path: Path) -> None:
    config = {"text_config": {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load(str(tmp_path)).weights_bytes is None and load(str(tmp_path)).sessions_fit(1000, 80) is None
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 10 * GIB}}))
    model = load(str(tmp_path))
    assert model.bytes_per_token == 2 * 2 * 4 * 64 * 2  # head dim from hidden size / heads, bf16 by default
    assert model.sessions_fit(1000, 12) == (2 * GIB) // (1000 * model.bytes_per_token)
    assert model.sessions_fit(1000, 8) == 0  # the weights alone do not fit
    with pytest.raises(ValueError, match="neither a shipped configuration"):
        load(str(tmp_path / "absent.json"))


def test_footprint_takes_each_sessions_peak_context() -> None:
    def row(*calls: tuple[int, int]) -> TaskRow:
        return task_row([{"calls": [[p, 0, c, 0.0, 0.0] for p, c in calls]}])

    out = footprint([row((1000, 50), (3000, 100)), row((500, 10))], load("llama-3.1-8b"), 80)
    assert out["max_peak_context"] == 3100 and out["peak_context"] == (3100 + 510) / 2
    assert out["context_per_call"] == (1050 + 3100 + 510) / 3 and out["sessions_fit"] > 0
