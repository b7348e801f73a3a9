"""Drafting from the prompt (prompt lookup) and the rule that accepts a draft.

A draft costs no model: it is what followed, earlier in the context (prompt and output so far), the longest match
of the context's last ``n`` tokens (``n`` from ``max_ngram`` down to ``min_ngram``; the latest match wins). Agent
outputs copy much of their prompt — ids of earlier states, the values a tool returned, arguments — so such drafts
are often right. The engine evaluates a draft in one batch, beside the token before it, and keeps its longest
prefix the model would have produced itself, plus the one token the model chose where the draft went wrong: at
least one token per forward pass, as without drafting.

The rule (``verify``): under greedy decoding a draft token is kept exactly when it is the verifier's own argmax at
its position, under the grammar's mask and the repetition penalty of the context before it — so the output is the
one-token path's, up to the order in which a batched forward sums (a near-tie can go the other way). Under sampling
the draft is a point mass, so a token ``d`` is kept with probability ``p(d)`` and, where it is not, the token is
drawn from ``p`` without ``d`` (renormalised): the standard speculative rule, which leaves each token's distribution
the model's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineConfigError

METHODS = {"lookup": "FlowState's own prompt lookup (llamacpp)", "ngram": "vLLM's n-gram proposer",
           "suffix": "vLLM's suffix decoding (arctic-inference)"}
"""The drafting methods a ``speculate=`` option names; each engine takes those it runs."""


@dataclass(frozen=True)
class Speculation:
    """``METHOD:K[:MIN-MAX]``: draft up to ``k`` tokens a step, from n-grams of ``min_ngram``..``max_ngram`` tokens
    (``suffix`` matches suffixes of any length: its bounds are unused)."""

    k: int
    max_ngram: int = 3
    min_ngram: int = 1
    method: str = "lookup"

    @classmethod
    def parse(cls, spec: str | None, methods: Sequence[str] = ("lookup",)) -> Speculation | None:
        """``None``/``""``/``off`` -> no drafting; ``METHOD:K`` -> drafts of up to K tokens (1 <= K <= 32), with
        ``:MIN-MAX`` the n-gram lengths matched (default 1-3), for a method in ``methods``."""
        if spec is None or spec in ("", "off"):
            return None
        method, _, rest = str(spec).partition(":")
        k, _, bounds = rest.partition(":")
        low, _, high = (bounds or "1-3").partition("-")
        if (method not in methods or not k.isdigit() or not 1 <= int(k) <= 32 or not low.isdigit()
                or not high.isdigit() or not 1 <= int(low) <= int(high) <= 16):
            forms = " or ".join(f"{m}:K[:MIN-MAX]" if m != "suffix" else f"{m}:K" for m in methods)
            raise EngineConfigError(f"speculate takes {forms} (K drafted tokens a step, 1-32; n-grams of MIN to MAX "
                                    f"tokens, 1-16) or off, not {spec!r}")
        return cls(int(k), int(high), int(low), method)

    def __str__(self) -> str:
        bounds = f":{self.min_ngram}-{self.max_ngram}" if (self.min_ngram, self.max_ngram) != (1, 3) else ""
        return f"{self.method}:{self.k}{bounds if self.method != 'suffix' else ''}"

    def vllm_config(self) -> dict[str, Any]:
        """vLLM's ``speculative_config`` for this method."""
        if self.method == "suffix":
            return {"method": "suffix", "num_speculative_tokens": self.k}
        return {"method": "ngram", "num_speculative_tokens": self.k, "prompt_lookup_min": self.min_ngram,
                "prompt_lookup_max": self.max_ngram}


class Lookup:
    """The context's n-grams, each mapped to where its latest continuation starts; extended token by token."""

    def __init__(self, speculation: Speculation, context: Sequence[int] = ()) -> None:
        self.spec = speculation
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the n-grams ending just before this token now have a continuation here
            for n in range(self.spec.min_ngram, self.spec.max_ngram + 1):
                if end >= n:
                    self._next[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(int(token))

    def propose(self, limit: int | None = None) -> list[int]:
        """Up to ``k`` (and ``limit``) tokens that followed the longest earlier match of the context's tail."""
        k = min(self.spec.k, self.spec.k if limit is None else limit)
        if k <= 0:
            return []
        for n in range(self.spec.max_ngram, self.spec.min_ngram - 1, -1):
            if len(self.tokens) > n:
                start = self._next.get(tuple(self.tokens[-n:]))
                if start is not None:
                    return self.tokens[start:start + k]
        return []



def verify(draft: Sequence[int], scores: Callable[[int], Any], choose: Callable[[Any, int | None], tuple[bool, int]]
           ) -> tuple[int, int]:
    """How many of ``draft`` to keep, and the token that follows them.

    ``scores(i)`` gives the verifier's processed logits at draft position ``i`` (its first ``i`` tokens kept);
    ``choose(logits, d)`` says whether ``d`` is kept there and, where it is not, the token chosen instead
    (``d=None``: past the draft, the next token)."""
    for i, d in enumerate(draft):
        kept, token = choose(scores(i), d)
        if not kept:
            return i, token
    return len(draft), choose(scores(len(draft)), None)[1]


def greedy(logits: Any, d: int | None) -> tuple[bool, int]:
    """Keep ``d`` exactly when it is the argmax (the first, on a tie, as numpy and llama.cpp's greedy take it)."""
    best = int(logits.argmax())
    return d is not None and best == d, best


def sampler(temperature: float, top_p: float, rng: Any) -> Callable[[Any, int | None], tuple[bool, int]]:
    """The speculative rule for a point-mass draft under temperature and top-p sampling."""
    import numpy as np

    def probabilities(logits: Any) -> Any:
        z = (logits - logits.max()) / temperature
        p = np.exp(z, where=np.isfinite(z), out=np.zeros_like(z, dtype=np.float64))
        p /= p.sum()
        if top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cut = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
            kept = np.zeros_like(p)
            kept[order[:cut]] = p[order[:cut]]
            p = kept / kept.sum()
        return p

    def choose(logits: Any, d: int | None) -> tuple[bool, int]:
        p = probabilities(logits)
        if d is not None:
            if rng.random() < p[d]:
                return True, d
            p[d] = 0.0
            p /= p.sum()
        return False, int(rng.choice(len(p), p=p))

    return choose
