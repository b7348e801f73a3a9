"""Chat prompts as text: one place where messages meet a tokenizer's chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.base import Message


def apply_template(tokenizer: Any, messages: Sequence[Message], kwargs: Mapping[str, Any] | None = None) -> str:
    """The tokenizer's chat template over ``messages``, ending with the assistant turn's header.

    ``kwargs`` reach the template as variables (e.g. ``enable_thinking=False`` for Qwen3-family templates).
    """
    chat = [{"role": m.role, "content": m.content} for m in messages]
    text: str = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **(kwargs or {}))
    return text


def completion_budget(requested: int, prompt_tokens: int, context: int | None) -> int:
    """The completion tokens a call may use: ``requested``, capped by what the context leaves after the prompt."""
    if context is None:
        return requested
    left = context - prompt_tokens
    if left < 1:
        from engine.errors import ContextOverflow

        raise ContextOverflow(f"the prompt ({prompt_tokens} tokens) fills the model's context of {context} tokens")
    return min(requested, left)


def check_options(engine: str, options: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """The options without Nones; an option the engine does not take is a configuration error."""
    from engine.errors import EngineConfigError

    given = {k: v for k, v in options.items() if v is not None}
    unknown = set(given) - known
    if unknown:
        raise EngineConfigError(f"the {engine} engine takes no option {', '.join(sorted(unknown))}")
    return given
