"""The scripted engine: replay, exhaustion, perfect-prefix-cache accounting, script errors, selection by name."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
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


def test_when_selects_the_first_unused_matching_line_under_concurrency(tmp_path: Path) -> None:
    lines = [{"text": f"{s}-{i}", "when": f"[{s}]"} for s in ("a", "b", "c", "d") for i in (1, 2, 3)]
    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in lines))
    e = ScriptedEngine.from_file(script)

    def session(name: str) -> list[str]:
        return [e.generate([Message("user", f"query [{name}] step {i}")]).text for i in range(3)]

    with ThreadPoolExecutor(4) as pool:
        results = dict(zip("abcd", pool.map(session, "abcd"), strict=True))
    assert results == {s: [f"{s}-1", f"{s}-2", f"{s}-3"] for s in "abcd"}
    with pytest.raises(EngineError, match="exhausted after 12"):
        e.generate([Message("user", "[a]")])
    e2 = ScriptedEngine([("x", "[z]"), "plain"])
    assert e2.generate([Message("user", "[a]")]).text == "plain"
    with pytest.raises(EngineError, match="none of its 1 unused outputs matches"):
        e2.generate([Message("user", "[a]")])


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
    with pytest.raises(EngineConfigError, match="valid engines: llamacpp, openai, scripted, transformers, vllm"):
        engine.load("nonesuch")


@pytest.mark.parametrize(("content", "message"), [
    ("", "holds no outputs"),
    ("[1, 2]\n", "line 1: not a JSON object"),
    ('{"text": 3}\n', 'expected an object with a string "text"'),
    ('{"text": "ok"}\n{oops\n', "line 2: not JSON"),
    ('{"text": "ok", "when": 1}\n', '"when" must be a string'),
])
def test_bad_scripts(tmp_path: Path, content: str, message: str) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text(content)
    with pytest.raises(EngineConfigError, match=message):
        ScriptedEngine.from_file(script)
