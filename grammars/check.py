"""Grammar checks without a model: validate a grammar, and test whether a text is in its language."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


class GrammarError(ValueError):
    """llguidance refuses the grammar; the message says why."""


@lru_cache(maxsize=1)
def _byte_tokenizer() -> Any:
    import llguidance

    return llguidance.LLTokenizer("byte")


def validate(grammar: str) -> None:
    """Raise ``GrammarError`` unless llguidance compiles the grammar."""
    import llguidance

    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar), _byte_tokenizer())
    except ValueError as exc:
        error = str(exc)
    if error:
        raise GrammarError(f"grammar refused: {error}")


def accepts(grammar: str, text: str, *, prefix: bool = False) -> bool:
    """True iff ``text`` is a complete sentence of the grammar (byte-level, no model needed); with ``prefix``, iff it
    is the start of one (what an output cut at its token budget must be)."""
    import llguidance

    tok = _byte_tokenizer()
    matcher = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", grammar), log_level=0)
    if matcher.is_error():
        raise GrammarError(f"grammar refused: {matcher.get_error()}")
    for token in tok.tokenize_str(text):
        if not matcher.consume_token(token):
            return False
    return (prefix or matcher.is_accepting()) and not matcher.is_error()
