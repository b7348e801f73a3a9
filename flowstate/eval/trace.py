"""Traces of an evaluation's model calls (``flowstate eval --trace FILE``), to replay against a real server.

Every model call of every session — the agent's steps and a memory method's own calls — is one line: its
session, the strategy and suite, its order in the session, its messages as the engine received them, its
output (its text) and token count, its grammar where it had one, and, where the engine reports them, how many of
the output's tokens the grammar forced. A text — a message, an output, a grammar — is written once per file
(``{"text": id, "content": …}``) and calls name it by id, so a chat that grows by appending, and a system message
or grammar every call repeats, cost their size once. The outputs and grammars are what ``flowstate bench capacity
--speculate`` replays drafting against; traces recorded before they were kept read with neither.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.base import Engine, Generation, Message, OnText, Sampling
from engine.jsonl import objects
from engine.purpose import STEP, Purpose


class TraceWriter:
    """Appends calls to a JSON Lines trace; safe to share between the evaluation's threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._order: dict[str, int] = {}
        if self.path.exists():  # a resumed run appends: its texts are known, its sessions' calls counted
            for call in _lines(self.path):
                if "text" in call:
                    self._known.add(call["text"])
                else:
                    self._order[call["session"]] = max(self._order.get(call["session"], 0), call["order"] + 1)

    def record(self, session: str, labels: dict[str, str], messages: Sequence[Message], gen: Generation,
               grammar: str | None = None) -> None:
        lines: list[dict[str, Any]] = []

        def text(content: str) -> str:
            key = hashlib.sha1(content.encode("utf-8")).hexdigest()[:16]
            if key not in self._known:
                lines.append({"text": key, "content": content})
            return key

        ids = [[m.role, text(m.content)] for m in messages]
        written = {"output": text(gen.text), **({"grammar": text(grammar)} if grammar else {})}
        with self._lock:
            # each text once: one the file holds is left out, one the call holds twice written once
            lines = list({line["text"]: line for line in lines if line["text"] not in self._known}.values())
            self._known.update(line["text"] for line in lines)
            order = self._order.get(session, 0)
            self._order[session] = order + 1
            lines.append({"session": session, **labels, "order": order, "messages": ids, **written,
                          "prompt_tokens": gen.usage.prompt_tokens, "completion_tokens": gen.usage.completion_tokens,
                          **({"forced_tokens": gen.usage.forced_tokens} if gen.usage.forced_tokens else {})})
            with self.path.open("a", encoding="utf-8") as f:
                f.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))


class RecordingEngine(Engine):
    """An engine that records every call it serves for one session into a trace, and changes nothing else."""

    def __init__(self, inner: Engine, writer: TraceWriter, session: str, labels: dict[str, str]) -> None:
        self.inner, self.writer, self.session, self.labels = inner, writer, session, labels
        self.name, self.model_name, self.capabilities = inner.name, inner.model_name, inner.capabilities

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        gen = self.inner.generate(messages, grammar=grammar, max_tokens=max_tokens, on_text=on_text,
                                  sampling=sampling, affinity=affinity, purpose=purpose, cache_salt=cache_salt,
                                  priority=priority)
        self.writer.record(self.session, self.labels, messages, gen, grammar)
        return gen

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


@dataclass(frozen=True)
class TracedCall:
    order: int
    messages: tuple[Message, ...]
    completion_tokens: int
    forced_tokens: int = 0  # of them, what the call's grammar forced (an engine that fast-forwards appends them)
    output: str | None = None  # the output's text (None in a trace recorded before outputs were kept)
    grammar: str | None = None  # the grammar the call decoded under, if any


def read(path: str | Path) -> dict[str, dict[str, list[TracedCall]]]:
    """A trace as strategy → session → its calls in order."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"no trace at {p} (flowstate eval --trace FILE writes one)")
    texts: dict[str, str] = {}
    out: dict[str, dict[str, list[TracedCall]]] = {}
    for line in _lines(p):
        if "text" in line:
            texts[line["text"]] = line["content"]
            continue
        try:
            messages = tuple(Message(role, texts[key]) for role, key in line["messages"])
        except KeyError as exc:
            raise ValueError(f"{p}: a call names a text the trace does not hold ({exc})") from exc
        calls = out.setdefault(str(line.get("strategy", "")), {}).setdefault(line["session"], [])
        try:
            output, grammar = (texts[line[k]] if k in line else None for k in ("output", "grammar"))
        except KeyError as exc:
            raise ValueError(f"{p}: a call names a text the trace does not hold ({exc})") from exc
        calls.append(TracedCall(int(line["order"]), messages, int(line["completion_tokens"]),
                                int(line.get("forced_tokens", 0)), output, grammar))
    for sessions in out.values():
        for calls in sessions.values():
            calls.sort(key=lambda c: c.order)
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [line for _, line in objects(path, "trace")]
