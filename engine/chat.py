"""Chat prompts as text: one place where messages meet a tokenizer's chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.base import Message


def apply_template(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The tokenizer's chat template over ``messages``, ending with the assistant turn's header."""
    chat = [{"role": m.role, "content": m.content} for m in messages]
    text: str = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return text


def check_options(engine: str, options: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """The options without Nones; an option the engine does not take is a configuration error."""
    from engine.errors import EngineConfigError

    given = {k: v for k, v in options.items() if v is not None}
    unknown = set(given) - known
    if unknown:
        raise EngineConfigError(f"the {engine} engine takes no option {', '.join(sorted(unknown))}")
    return given
