"""An engine given as one value (``engine/spec.py``): what each form means, and the errors."""

from __future__ import annotations

import pytest

from engine.errors import EngineConfigError
from engine.spec import label, parse


def test_the_short_form_names_backend_model_and_servers() -> None:
    assert parse("llamacpp") == {"name": "llamacpp"}
    assert parse("openai:Qwen/Qwen3.5-27B@http://gpu1:8000/v1,temperature=0.1,max-tokens=512") == {
        "name": "openai", "model": "Qwen/Qwen3.5-27B", "base_url": "http://gpu1:8000/v1", "temperature": 0.1,
        "max_tokens": 512}
    # a model name with a colon; more servers continue the URL list (routed by session)
    assert parse("openai:qwen3:8b@http://a/v1,http://b/v1") == {
        "name": "openai", "model": "qwen3:8b", "base_url": "http://a/v1,http://b/v1"}
    assert parse("openai@http://a/v1") == {"name": "openai", "base_url": "http://a/v1"}
    assert parse("scripted:out.jsonl") == {"name": "scripted", "script": "out.jsonl"}
    assert label(parse("scripted:out.jsonl")) == "scripted:out.jsonl" and label(parse("vllm")) == "vllm:default"


def test_pairs_nested_arguments_and_the_long_form() -> None:
    assert parse("engine=openai,model=m,base-url=http://x/v1") == {"name": "openai", "model": "m",
                                                                   "base_url": "http://x/v1"}
    spec = "vllm:/models/q,vllm.kv_cache_dtype=fp8,vllm.max-num-seqs=256,chat-template.enable_thinking=false"
    assert parse(spec) == {
        "name": "vllm", "model": "/models/q", "engine_args": {"kv_cache_dtype": "fp8", "max_num_seqs": 256},
        "chat_template_kwargs": {"enable_thinking": False}}
    # drafting, as each engine spells it (the engine checks the method: llamacpp lookup, vllm ngram or suffix)
    assert parse("vllm:/models/q,speculate=ngram:4:2-4") == {"name": "vllm", "model": "/models/q",
                                                             "speculate": "ngram:4:2-4"}
    assert parse("llamacpp,speculate=lookup:4") == {"name": "llamacpp", "speculate": "lookup:4"}


@pytest.mark.parametrize(("text", "message"), [
    ("", "--engine needs an engine"),
    ("openai:m,colour=red", "not 'colour=red'"),
    ("openai:m,temperature=hot", "temperature takes a number, not 'hot'"),
    ("model=m", "needs a backend name first"),
    ("openai:m,vllm.=3", "not 'vllm.=3'"),
])
def test_a_bad_spec_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        parse(text)
