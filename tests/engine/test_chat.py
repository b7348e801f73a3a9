"""Chat templates and sampling options reach the model: template kwargs (Qwen's enable_thinking), the
paper preset, the completion budget capped by the context, and finish reasons reported."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import engine as engines
from engine.base import Message
from engine.chat import apply_template, completion_budget
from engine.errors import ContextOverflow, EngineConfigError

# A Qwen3-style template: the generation prompt opens a think block unless enable_thinking is false.
QWEN_STYLE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif %}"
)
MESSAGES = [Message("system", "rules"), Message("user", "hello")]


@pytest.fixture(scope="module")
def qwen_style_tokenizer() -> Any:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tokenizer.chat_template = QWEN_STYLE
    return tokenizer


def test_enable_thinking_false_renders_without_a_think_block(qwen_style_tokenizer: Any) -> None:
    thinking = apply_template(qwen_style_tokenizer, MESSAGES)
    plain = apply_template(qwen_style_tokenizer, MESSAGES, {"enable_thinking": False})
    assert thinking.endswith("<|im_start|>assistant\n<think>\n")
    assert plain.endswith("<|im_start|>assistant\n") and "<think>" not in plain


def test_the_completion_budget_is_capped_by_the_context() -> None:
    assert completion_budget(32_768, 1_000, 8_192) == 7_192
    assert completion_budget(1_024, 1_000, 8_192) == 1_024
    assert completion_budget(32_768, 1_000, None) == 32_768
    with pytest.raises(ContextOverflow, match="fills the model's context"):
        completion_budget(10, 8_192, 8_192)


def test_a_preset_fills_only_options_a_backend_takes_and_explicit_options_win(tmp_path) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text('{"text": "x"}\n')
    assert engines.load("scripted", preset="paper", script=str(script)).name == "scripted"  # takes none of them
    with pytest.raises(ValueError, match="valid presets: paper"):
        engines.load("scripted", preset="fast", script=str(script))


class _Recorder(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that records request bodies and streams one answer cut at the budget."""

    bodies: list[dict[str, Any]] = []
    headers: list[dict[str, str]] = []
    owner = "x"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # /v1/models
        self._json({"object": "list", "data": [{"id": "m", "object": "model", "created": 0,
                                                "owned_by": type(self).owner}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        type(self).headers.append({k.lower(): v for k, v in self.headers.items()})
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        events = [
            {**chunk,
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "<state_fo"}, "finish_reason": None}]},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
            {**chunk, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}},
        ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.bodies, _Recorder.headers, _Recorder.owner = [], [], "x"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_the_paper_preset_reaches_an_openai_compatible_server(recorder: str) -> None:
    engine = engines.load("openai", base_url=recorder, preset="paper", top_p=0.9)
    generation = engine.generate(MESSAGES, grammar=None)
    body = _Recorder.bodies[-1]
    assert body["temperature"] == 0.1 and body["top_p"] == 0.9  # the explicit option wins over the preset
    assert body["max_tokens"] == 32_768  # the server caps it at what its context leaves (vLLM does)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert generation.truncated and generation.usage.completion_tokens == 3


def test_without_a_preset_no_template_kwargs_are_sent(recorder: str) -> None:
    engines.load("openai", base_url=recorder).generate(MESSAGES)
    assert "chat_template_kwargs" not in _Recorder.bodies[-1]


def test_a_vllm_server_gets_the_calls_cache_salt_and_every_server_the_session_header(recorder: str) -> None:
    """cache_salt=auto: sent only to a server whose models are vLLM's (another may refuse an unknown field); the
    session's routing id goes in x-session-id (or the header named) on every call to any server."""
    engine = engines.load("openai", base_url=recorder)  # its models are owned_by "x": not vLLM
    engine.generate(MESSAGES, affinity="tenant/session-1", cache_salt="salt-a")
    assert "cache_salt" not in _Recorder.bodies[-1] and not engine.capabilities.salts
    assert _Recorder.headers[-1]["x-session-id"] == "tenant/session-1"
    said = engines.load("openai", base_url=recorder, cache_salt="on", session_header="x-dynamo-session-id")
    said.generate(MESSAGES, affinity="tenant/session-2", cache_salt="salt-b")
    assert _Recorder.bodies[-1]["cache_salt"] == "salt-b" and said.capabilities.salts
    assert _Recorder.headers[-1]["x-dynamo-session-id"] == "tenant/session-2"
    _Recorder.owner = "vllm"
    found = engines.load("openai", base_url=recorder, model="m")
    found.generate(MESSAGES, cache_salt="salt-c")
    assert _Recorder.bodies[-1]["cache_salt"] == "salt-c" and found.capabilities.salts
    found.generate(MESSAGES)
    assert "cache_salt" not in _Recorder.bodies[-1] and "x-session-id" not in _Recorder.headers[-1]
    with pytest.raises(EngineConfigError, match="cache_salt is auto, on or off"):
        engines.load("openai", base_url=recorder, cache_salt="maybe")


@pytest.mark.parametrize("owner", ["vllm", "x"])
def test_a_server_down_at_start_says_its_kind_at_the_first_call_it_answers(owner: str) -> None:
    """cache_salt and priority left auto, a model named, and the server not up yet (a vLLM still loading its model):
    nothing is decided then, no call goes out while the server has not said what it is, and the first call it
    answers reads its kind — a vLLM server gets the salt and the priority from that call on, another neither."""
    from engine.errors import EngineUnavailable
    from engine.router import RouterEngine
    from tests.engine.test_errors import free_port

    port = free_port()
    engine = engines.load("openai", base_url=f"http://127.0.0.1:{port}/v1", model="m", retries=0)
    router = RouterEngine([engine])
    assert not engine.capabilities.known and not engine.capabilities.salts and not router.capabilities.known
    with pytest.raises(EngineUnavailable, match="has not said what kind"):
        engine.generate(MESSAGES, cache_salt="salt-a", priority=2)
    _Recorder.bodies, _Recorder.headers, _Recorder.owner = [], [], owner
    server = ThreadingHTTPServer(("127.0.0.1", port), _Recorder)  # the server comes up
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        router.generate(MESSAGES, cache_salt="salt-b", priority=2)
        body = _Recorder.bodies[-1]
        vllm = owner == "vllm"
        assert engine.capabilities.known and engine.capabilities.salts == engine.capabilities.priority == vllm
        assert (body.get("cache_salt"), body.get("priority")) == (("salt-b", 2) if vllm else (None, None))
        assert router.capabilities.known and router.capabilities.salts == vllm
    finally:
        server.shutdown()
