"""The engine seam: the one Protocol every model backend implements, and the values it returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    """One chat message of a prompt."""

    role: Role
    content: str


@dataclass(frozen=True)
class Usage:
    """What one model call cost; backends fill what they can measure, zero otherwise."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    decode_s: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            ttft_s=self.ttft_s + other.ttft_s,
            decode_s=self.decode_s + other.decode_s,
        )

    def to_dict(self) -> dict[str, float | int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_s": round(self.ttft_s, 6),
            "decode_s": round(self.decode_s, 6),
        }


@dataclass(frozen=True)
class Generation:
    """The raw text of one model call, its usage, and why decoding stopped."""

    text: str
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"  # "length": cut at the completion budget

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@runtime_checkable
class Engine(Protocol):
    """A model backend: generate under an optional grammar, and count tokens.

    ``grammar`` is a grammar text in llguidance's Lark dialect (see ``grammars/``);
    backends that cannot constrain decoding say so by raising ``EngineConfigError``
    when given one they cannot honour, never by ignoring it silently.
    """

    name: str
    supports_grammar: bool  # False: the loop never builds grammars for this engine

    def generate(
        self,
        messages: Sequence[Message],
        *,
        grammar: str | None = None,
        max_tokens: int | None = None,
    ) -> Generation: ...

    def count_tokens(self, text: str) -> int: ...


@dataclass(frozen=True)
class Sampling:
    """Sampling of one call, over the engine's own defaults (None keeps the default). Engines name the
    fields they honour in ``sampling_fields`` and take ``sampling=`` in ``generate``; callers refuse the rest."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def given(self) -> frozenset[str]:
        return frozenset(k for k in ("temperature", "top_p", "seed") if getattr(self, k) is not None)


def sampling_fields(engine: object) -> frozenset[str]:
    """The ``Sampling`` fields ``engine.generate`` honours per call (none for engines that do not say)."""
    return frozenset(getattr(engine, "sampling_fields", frozenset()))


OnText = Callable[[str], None]
"""Receives an output's text piece by piece while it is decoded (engines with ``streams = True`` take
``on_text=`` in ``generate``; the pieces join to the returned text)."""


def streams(engine: object) -> bool:
    """Whether ``engine.generate`` takes ``on_text``."""
    return bool(getattr(engine, "streams", False))
