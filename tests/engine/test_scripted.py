"""The scripted engine: replay, exhaustion, perfect-prefix-cache accounting, script errors, selection by name."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine
from engine.base import Engine, Message
from engine.errors import EngineConfigError, EngineError
from engine.scripted import ScriptedEngine


def test_replays_in_order_then_raises() -> None:
    e = ScriptedEngine(["one", "two"])
    assert isinstance(e, Engine)
    msgs = [Message("user", "hi")]
    assert e.generate(msgs).text == "one" and e.generate(msgs).text == "two"
    with pytest.raises(EngineError, match="exhausted after 2 outputs") as info:
        e.generate(msgs)
    assert info.value.retryable is False


def test_cached_tokens_are_the_common_prefix_with_the_previous_prompt() -> None:
    e = ScriptedEngine(["a", "b", "c"])
    first = e.generate([Message("system", "rules"), Message("user", "alpha beta")]).usage
    second = e.generate([Message("system", "rules"), Message("user", "alpha gamma")]).usage
    third = e.generate([Message("system", "other"), Message("user", "alpha gamma")]).usage
    assert first.cached_tokens == 0 and first.prompt_tokens > 0
    assert 0 < second.cached_tokens < second.prompt_tokens
    assert third.cached_tokens < second.cached_tokens


def test_load_by_name(tmp_path: Path) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text('{"text": "x"}\n\n{"text": "y"}\n')
    e = engine.load("scripted", script=script)
    assert isinstance(e, ScriptedEngine) and e.remaining == 2
    with pytest.raises(EngineConfigError, match="valid engines: openai, scripted, transformers, vllm"):
        engine.load("nonesuch")


@pytest.mark.parametrize(("content", "message"), [
    ("", "holds no outputs"),
    ("[1, 2]\n", 'expected an object with a string "text"'),
    ('{"text": 3}\n', 'expected an object with a string "text"'),
    ('{"text": "ok"}\n{oops\n', "line 2: not JSON"),
])
def test_bad_scripts(tmp_path: Path, content: str, message: str) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text(content)
    with pytest.raises(EngineConfigError, match=message):
        ScriptedEngine.from_file(script)
