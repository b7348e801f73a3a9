"""The answer of an OpenAI-compatible test server on loopback: one streamed chat completion with its usage."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def send_completion(handler: BaseHTTPRequestHandler, text: str, prompt_tokens: int, cached_tokens: int) -> None:
    """Answer the handler's POST with ``text`` as one streamed chunk, then the usage chunk and [DONE]."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 10, "total_tokens": prompt_tokens + 10,
             "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                     "finish_reason": "stop"}]},
              {**chunk, "choices": [], "usage": usage}]
    send(handler, b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n",
         "text/event-stream")


def send(handler: BaseHTTPRequestHandler, data: bytes, kind: str) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
