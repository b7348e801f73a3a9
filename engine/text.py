"""Text helpers shared by engines without a tokenizer of their own, the reference policies and the benches: the
plain-text rendering of a chat prompt, a word/punctuation tokenizer, and the common prefix of two token lists
(what a perfect prefix cache would serve)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from engine.base import Message

_TOKEN = re.compile(r"\w+|[^\w\s]|\s+")


def tokenize(text: str) -> list[str]:
    """Split text into word, punctuation and whitespace-run tokens."""
    return _TOKEN.findall(text)


def flatten(messages: Sequence[Message]) -> str:
    """The plain-text rendering of a chat prompt used by engines without a chat template."""
    return "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages) + "<|assistant|>\n"


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix of two sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
