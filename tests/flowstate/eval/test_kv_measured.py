"""flowstate/eval/kv.py's KV bytes per token against a real transformers cache: a randomly initialised model of a
small Llama shape keeps exactly that many bytes per token of context (CPU: the cache's tensors; GPU: what CUDA
allocates for them)."""

from __future__ import annotations

from typing import Any

import pytest

from flowstate.eval.kv import from_config

TOKENS = 512


def model(device: str) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval(), config


def cache_bytes(cache: Any) -> int:
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers ≥ 4.56: one object per layer
        return sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))
    return sum(t.numel() * t.element_size() for t in (*cache.key_cache, *cache.value_cache))


def expected(config: Any) -> int:
    return from_config({**config.to_dict(), "torch_dtype": "bfloat16"}, "test").bytes_per_token


def test_the_kv_cache_holds_what_kv_py_computes_per_token() -> None:
    import torch

    hf, config = model("cpu")
    with torch.no_grad():
        out = hf(torch.randint(0, 256, (1, TOKENS)), use_cache=True)
    assert expected(config) == 2 * 3 * 2 * 16 * 2  # K and V × layers × KV heads × head dim × bf16 bytes
    assert cache_bytes(out.past_key_values) == expected(config) * TOKENS


@pytest.mark.gpu
def test_cuda_allocates_for_the_cache_what_kv_py_computes_per_token() -> None:
    import torch

    hf, config = model("cuda")
    ids = torch.randint(0, 256, (1, TOKENS), device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        out = hf(ids, use_cache=True)
    cache = out.past_key_values
    del out  # the logits and activations go; the cache stays
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    assert cache_bytes(cache) == expected(config) * TOKENS
    assert abs(held - expected(config) * TOKENS) <= 0.02 * expected(config) * TOKENS  # the allocator's rounding
