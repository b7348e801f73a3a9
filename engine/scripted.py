"""The scripted engine: replays recorded raw model outputs, for fast deterministic tests of the loop.

A script is a JSON Lines file, one object per model call, with the raw output under ``"text"``
(and ``"finish_reason": "length"`` for an output that was cut at the completion budget).
A line may carry ``"when"``: then it serves the first call whose prompt contains that text, so a
script stays deterministic when many sessions call the engine concurrently (each call takes the
first unused line that matches; lines without ``"when"`` match any prompt).
Token counts use a simple word/punctuation split, and ``cached_tokens`` is what a perfect prefix
cache would serve: the longest common token prefix with the previous call's prompt.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from engine.base import ALL_SAMPLING, Capabilities, Engine, Generation, Message, OnText, Sampling, Usage
from engine.chat import check_options
from engine.errors import EngineConfigError, EngineError
from engine.jsonl import objects
from engine.purpose import STEP, Purpose
from engine.text import common_prefix, flatten, tokenize


class ScriptedEngine(Engine):
    """Replays raw outputs in order; raises once the script is exhausted."""

    name = "scripted"
    # replays each output token by token to on_text; sampling is recorded in ``calls`` (a replay samples nothing)
    # no cache: nothing to share
    capabilities = Capabilities(streams=True, sampling=ALL_SAMPLING, salts=True, priority=True)
    options = frozenset({"script", "grammar"})

    def __init__(self, outputs: Iterable[str | tuple[str, str | None] | tuple[str, str | None, str]], *,
                 grammar: bool = False, record: bool = True) -> None:
        """``grammar``: take grammars as an engine that decodes under them would (recorded in ``calls``; the
        replayed text is not checked against them), so that the loop builds them as for a real model; ``record``:
        keep every prompt in ``prompts`` (for a test to read; a server loads it with ``record=False``, as a real
        engine keeps nothing)."""
        self.record = record
        if grammar:
            self.capabilities = Capabilities(grammar=True, streams=True, sampling=ALL_SAMPLING, salts=True,
                                             priority=True)
        self._outputs = [(o, None, "stop") if isinstance(o, str) else (*o, "stop")[:3] for o in outputs]
        self._used = [False] * len(self._outputs)
        self.salts: list[str | None] = []  # each call's cache_salt
        self.priorities: list[int] = []  # each call's priority
        self._lock = threading.Lock()
        self._last_prompt: list[str] = []
        self._salt: str | None = None  # the partition the last prompt was cached under
        self.prompts: list[list[Message]] = []
        self.calls: list[dict[str, Any]] = []  # per call: the grammar, budget and sampling it was asked for

    @classmethod
    def from_file(cls, path: str | Path, *, grammar: bool = False) -> ScriptedEngine:
        """Load a JSON Lines script: one ``{"text": ...}`` object per model call."""
        p = Path(path)
        outputs: list[tuple[str, str | None, str]] = []
        for number, obj in objects(p, "script", EngineConfigError):
            if not isinstance(obj.get("text"), str):
                raise EngineConfigError(f'script {p} line {number}: expected an object with a string "text"')
            when = obj.get("when")
            if when is not None and not isinstance(when, str):
                raise EngineConfigError(f'script {p} line {number}: "when" must be a string')
            finish = obj.get("finish_reason", "stop")
            if finish not in ("stop", "length"):
                raise EngineConfigError(f'script {p} line {number}: "finish_reason" must be "stop" or "length"')
            outputs.append((obj["text"], when, finish))
        if not outputs:
            raise EngineConfigError(f"script {p} holds no outputs")
        return cls(outputs, grammar=grammar)

    @classmethod
    def from_options(cls, script: str | Path | None = None, grammar: bool = False, record: bool = False,
                     **unknown: Any) -> ScriptedEngine:
        """Factory used by ``engine.load('scripted', script=...)``: loaded by name (a server, a demo) it keeps no
        prompts unless ``record`` is asked for."""
        check_options(cls.name, unknown, set())
        if script is None:
            raise EngineConfigError("the scripted engine needs a script (--script FILE, JSON Lines with a "
                                    "\"text\" key)")
        engine = cls.from_file(script, grammar=grammar)
        engine.record = record
        return engine

    @property
    def remaining(self) -> int:
        return self._used.count(False)

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        if grammar is not None and not self.capabilities.grammar:
            raise EngineConfigError("this scripted engine takes no grammars (ScriptedEngine(..., grammar=True) does)")
        rendered = flatten(messages)
        self.salts.append(cache_salt)  # what each call was salted with (a test reads it)
        self.priorities.append(priority)
        with self._lock:
            line = next(
                (i for i, (_, when, _finish) in enumerate(self._outputs)
                 if not self._used[i] and (when is None or when in rendered)),
                None,
            )
            if line is None:
                if all(self._used):
                    raise EngineError(f"scripted engine exhausted after {len(self._outputs)} outputs")
                raise EngineError(f"scripted engine: none of its {self.remaining} unused outputs matches this prompt")
            self._used[line] = True
            text, _, finish = self._outputs[line]
            if self.record:
                self.prompts.append(list(messages))
                self.calls.append({"grammar": grammar, "max_tokens": max_tokens, "sampling": sampling})
            prompt = tokenize(rendered)
            cached = common_prefix(prompt, self._last_prompt) if cache_salt == self._salt else 0  # another partition's
            self._last_prompt, self._salt = prompt, cache_salt
        pieces = tokenize(text)
        if on_text is not None:
            for piece in pieces:
                on_text(piece)
        usage = Usage(prompt_tokens=len(prompt), cached_tokens=cached, completion_tokens=len(pieces))
        return Generation(text=text, usage=usage, finish_reason=finish)

    def count_tokens(self, text: str) -> int:
        return len(tokenize(text))
