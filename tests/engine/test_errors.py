"""Engine faults name their cause: bad model paths, unreachable servers, unknown options."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import engine
from engine.errors import EngineConfigError, EngineUnavailable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_transformers_bad_model_path(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="neither a local Hugging Face folder"):
        engine.load("transformers", model=str(tmp_path / "nope"))


def test_transformers_unreadable_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(EngineConfigError, match="cannot load model"):
        engine.load("transformers", model=str(bad))


def test_vllm_needs_a_transformers_folder(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="needs --model"):
        engine.load("vllm")
    with pytest.raises(EngineConfigError, match="not a transformers folder"):
        engine.load("vllm", model=str(tmp_path))


def test_openai_unreachable_server_is_retried_then_named() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EngineUnavailable, match=f"server {url} unreachable after 2 tries") as info:
        engine.load("openai", base_url=url, retries=1, backoff_s=0.01)
    assert info.value.retryable is True


def test_openai_needs_a_base_url() -> None:
    with pytest.raises(EngineConfigError, match="needs --base-url"):
        engine.load("openai")


@pytest.mark.parametrize("name", ["transformers", "vllm", "openai"])
def test_unknown_options_are_refused(name: str) -> None:
    with pytest.raises(EngineConfigError, match=f"the {name} engine takes no option script"):
        engine.load(name, script="x.jsonl")
