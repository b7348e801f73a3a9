"""The engine seam: the one base every model backend implements, its declared capabilities, and the values
it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from engine.purpose import STEP, Purpose

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
    shared_tokens: int = 0  # the prompt's fixed deployment prefix (its system message), where the engine counts it
    forced_tokens: int = 0  # completion tokens the grammar forced, appended without a decode step each
    mask_s: float = 0.0  # of decode_s, the time computing and applying the grammar's token masks (where measured)
    drafted_tokens: int = 0  # tokens drafted for verification (speculative decoding, where the engine drafts)
    accepted_tokens: int = 0  # of them, the ones kept (each a completion token that cost no forward pass of its own)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            ttft_s=self.ttft_s + other.ttft_s,
            decode_s=self.decode_s + other.decode_s,
            shared_tokens=self.shared_tokens + other.shared_tokens,
            forced_tokens=self.forced_tokens + other.forced_tokens,
            mask_s=self.mask_s + other.mask_s,
            drafted_tokens=self.drafted_tokens + other.drafted_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
        )

    def to_dict(self) -> dict[str, float | int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_s": round(self.ttft_s, 6),
            "decode_s": round(self.decode_s, 6),
            **({"shared_tokens": self.shared_tokens} if self.shared_tokens else {}),
            **({"forced_tokens": self.forced_tokens} if self.forced_tokens else {}),
            **({"mask_s": round(self.mask_s, 6)} if self.mask_s else {}),
            **({"drafted_tokens": self.drafted_tokens} if self.drafted_tokens else {}),
            **({"accepted_tokens": self.accepted_tokens} if self.accepted_tokens else {}),
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


@dataclass(frozen=True)
class Sampling:
    """Sampling of one call, over the engine's own defaults (None keeps the default). Engines name the
    fields they honour in ``Capabilities.sampling``; callers refuse the rest."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def given(self) -> frozenset[str]:
        return frozenset(k for k in ("temperature", "top_p", "seed") if getattr(self, k) is not None)

    def over(self, default: Decoding) -> Decoding:
        """This call's sampling over an engine's own: each field given here wins (the one place they merge)."""
        return Decoding(default.temperature if self.temperature is None else self.temperature,
                        default.top_p if self.top_p is None else self.top_p,
                        default.seed if self.seed is None else self.seed)


@dataclass(frozen=True)
class Decoding:
    """An engine's own sampling, which a call's ``Sampling`` overrides field by field."""

    temperature: float = 0.0  # greedy
    top_p: float = 1.0
    seed: int | None = None


OnText = Callable[[str], None]
"""Receives an output's text piece by piece while it is decoded (engines whose capabilities say ``streams``;
the pieces join to the returned text)."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do besides generating and counting tokens — declared, so that callers read it
    here and never probe the engine for attributes."""

    grammar: bool = False  # decodes under a grammar (False: the loop never builds grammars for it)
    streams: bool = False  # hands the output to ``on_text`` while decoding
    sampling: frozenset[str] = frozenset()  # the ``Sampling`` fields honoured per call; callers refuse the rest
    routes: bool = False  # several servers: ``affinity`` keeps a session's calls on one
    embedded: bool = False  # a tiny embedded model: the compact protocol limits fit it
    prefix_cache_reset: bool = False  # ``reset_prefix_cache`` empties the engine's prefix cache
    stats: bool = False  # ``server_stats`` reports per-server figures
    salts: bool = False  # honours ``cache_salt``: no call reuses a prefix cached under another salt
    priority: bool = False  # honours ``priority``: of the calls waiting, the lowest value's goes first
    shares: bool = False  # ``share_prefix``: every salt reuses the deployment's shared prefix
    known: bool = True  # False while what the backend honours is not read yet (an OpenAI-compatible server
    # down at start: ``salts`` and ``priority`` are decided at the first call it answers)


ALL_SAMPLING = frozenset({"temperature", "top_p", "seed"})


class Engine(ABC):
    """A model backend: generate under an optional grammar, and count tokens.

    ``grammar`` is a grammar text in llguidance's Lark dialect (see ``grammars/``); backends that cannot
    constrain decoding declare so (``capabilities.grammar`` False) and raise ``EngineConfigError`` when
    given one, never ignoring it silently. ``on_text``, ``sampling`` and ``affinity`` are honoured as the
    capabilities say and ignored otherwise; ``purpose`` says what the call is for (see ``Purpose``).
    ``cache_salt`` names the prefix-cache partition the call belongs to (a tenant's, a session's; None: the shared
    one): an engine whose capabilities say ``salts`` never lets a call reuse a prefix cached under another salt, so
    neither its speed nor the ``cached_tokens`` it reports tells one tenant what another sent. ``priority`` orders
    the calls that wait (lower first, vLLM's convention; see ``engine.priority``) where the capabilities say so.
    """

    name: str = "engine"
    model_name: str = ""  # the model it serves, as clients may name it ("" when it has no name of its own)
    capabilities: Capabilities = Capabilities()

    @abstractmethod
    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation: ...

    @abstractmethod
    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None:
        """Release the model (memory, servers' connections); the engine is unusable afterwards."""

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (benchmarks measure cold prefills); only where the capabilities say so."""
        raise NotImplementedError(f"the {self.name} engine declares no prefix-cache reset")

    def share_prefix(self, messages: Sequence[Message]) -> None:
        """Declare the prompt opening every partition sends alike (the deployment's system message): a call salted
        apart from the cache's holder still reuses that much of it — it tells no one anything they did not send
        themselves. Only where the capabilities say ``shares``."""
        raise NotImplementedError(f"the {self.name} engine keeps no prefix shared across salts")

    def server_stats(self) -> dict[str, dict[str, float]]:
        """Per-server figures (calls, tokens, errors, down); only where the capabilities say so."""
        return {}


class RemoteEngine(Engine):
    """An engine whose calls go to a server at ``base_url`` (what a router spreads sessions over)."""

    base_url: str
