"""vLLM engine arguments: any field of vLLM's own dataclass passes through, anything else is a clear error
before a model loads; the command line's --vllm-arg; the warning when a prompt's repeated prefix is not reused."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from engine.base import Generation, Message, Usage
from engine.errors import EngineConfigError
from engine.scripted import ScriptedEngine
from engine.vllm import check_engine_args
from flowstate import Agent, Repository
from tests.helpers import add, output


@dataclasses.dataclass
class FakeEngineArgs:  # the shape of vllm's AsyncEngineArgs: a dataclass of named arguments
    model: str = ""
    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    kv_cache_dtype: str = "auto"


def test_known_engine_arguments_pass_and_unknown_ones_name_the_closest() -> None:
    assert check_engine_args({"tensor_parallel_size": 8, "kv_cache_dtype": "fp8"}, FakeEngineArgs) == {
        "tensor_parallel_size": 8, "kv_cache_dtype": "fp8"}
    with pytest.raises(EngineConfigError,
                       match="unknown vLLM engine argument 'max_num_seq'; did you mean max_num_seqs"):
        check_engine_args({"max_num_seq": 4}, FakeEngineArgs)
    with pytest.raises(EngineConfigError, match="--model"):
        check_engine_args({"model": "x"}, FakeEngineArgs)


def test_the_command_line_parses_vllm_args() -> None:
    from click.testing import CliRunner

    from flowstate.cli import main

    seen: dict[str, Any] = {}

    def fake_load(name: str, **options: Any) -> Any:
        seen.update(options)
        raise EngineConfigError("stop here")

    import engine as engines

    original = engines.load
    engines.load = fake_load  # type: ignore[assignment]
    try:
        result = CliRunner().invoke(main, ["run", "q", "--engine", "vllm", "--vllm-arg", "tensor_parallel_size=8",
                                           "--vllm-arg", "kv-cache-dtype=fp8", "--vllm-arg",
                                           "enable_chunked_prefill=true"])
    finally:
        engines.load = original  # type: ignore[assignment]
    assert "stop here" in result.output
    assert seen["engine_args"] == {"tensor_parallel_size": 8, "kv_cache_dtype": "fp8", "enable_chunked_prefill": True}
    bad = CliRunner().invoke(main, ["run", "q", "--vllm-arg", "oops"])
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output


class NoCache(ScriptedEngine):
    """Reports every prompt token as uncached, as a server without prefix caching does."""

    def generate(self, messages: Sequence[Message], **kw: Any) -> Generation:
        gen = super().generate(messages, **kw)
        return Generation(gen.text, Usage(prompt_tokens=gen.usage.prompt_tokens, completion_tokens=1),
                          gen.finish_reason)


def test_a_call_that_repeats_a_prefix_but_reuses_none_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    for engine, warned in ((NoCache([output(delta=[add("k1")]), output(content="done")]), True),
                           (ScriptedEngine([output(delta=[add("k1")]), output(content="done")]), False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flowstate.loop"), Repository.open(":memory:") as repo:
            Agent(engine, repository=repo, session="s").run("q")
        assert ("0 cached prompt tokens" in caplog.text) is warned
