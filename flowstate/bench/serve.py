"""``flowstate bench serve``: what the endpoint costs on top of its engine, with N concurrent sessions.

For each N, N sessions each send one turn to a real ``flowstate serve`` (uvicorn on loopback, the
official ``openai`` client, one thread per session) and every model call the server makes is
recorded. Then the same calls — the same prompts, grammars and budgets, each session's in order —
are sent straight to the same engine from N threads. Both phases start from an empty prefix cache
where the engine can empty it. The ratio of output tokens per second (FlowState / direct) is the
share of the engine's throughput that reaches clients through the endpoint.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.base import Engine, Generation, Message, OnText, Sampling
from engine.purpose import STEP, Purpose
from flowstate.bench.table import table


@dataclass
class _Call:
    session: str
    messages: list[Message]
    grammar: str | None
    max_tokens: int | None


class Recorder(Engine):
    """Passes every call to the engine and keeps it, by session (the session's tag is in its prompt)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name, self.model_name, self.capabilities = inner.name, inner.model_name, inner.capabilities
        self.calls: list[_Call] = []
        self.completion_tokens = 0
        self._lock = threading.Lock()

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        gen = self.inner.generate(messages, grammar=grammar, max_tokens=max_tokens, on_text=on_text, sampling=sampling,
                                  affinity=affinity, purpose=purpose, cache_salt=cache_salt,
                                  priority=priority)
        tag = next((w for w in messages[-1].content.split() if w.startswith("#s")), "")
        with self._lock:
            self.calls.append(_Call(tag, list(messages), grammar, max_tokens))
            self.completion_tokens += gen.usage.completion_tokens
        return gen

    def count_tokens(self, text: str) -> int:
        return int(self.inner.count_tokens(text))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


APIS = ("chat", "responses")


def _through_flowstate(recorder: Recorder, n: int, loop: Any, api: str = "chat") -> tuple[float, int, int]:
    """N sessions, one turn each, through a real server's ``api`` (Chat Completions or Responses); (wall seconds,
    output tokens, failed turns)."""
    import openai
    import uvicorn

    from flowstate.store.repository import Repository
    from serving.app import create_app
    from serving.services import ServerConfig

    with tempfile.TemporaryDirectory() as tmp:
        repo = Repository.open(Path(tmp) / "bench.db")
        port = _free_port()
        app = create_app(ServerConfig(engine=recorder, repo=repo, loop=loop))
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)

        def session(i: int) -> bool:  # the same prompt through either API: the same model calls to compare
            text = f"#s{n}x{i} Greet guest {i} of the hotel in one short sentence."
            try:
                if api == "responses":
                    client.responses.create(model="flowstate", conversation=f"bench-{api}-{n}-{i}", input=text)
                else:
                    client.chat.completions.create(model="flowstate", user=f"bench-{api}-{n}-{i}",
                                                   messages=[{"role": "user", "content": text}])
                return True
            except openai.APIStatusError:  # the model failed the turn: its calls still count, on both sides
                return False

        before = recorder.completion_tokens
        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            ok = list(pool.map(session, range(n)))
        wall = time.perf_counter() - started
        server.should_exit = True
        thread.join(timeout=30)
        repo.close()
    return wall, recorder.completion_tokens - before, ok.count(False)


def _direct(engine: Engine, calls: list[_Call], n: int) -> tuple[float, int]:
    """The same calls straight to the engine: each session's calls in order, N sessions at once."""
    by_session: dict[str, list[_Call]] = {}
    for call in calls:
        by_session.setdefault(call.session, []).append(call)
    tokens: list[int] = []
    lock = threading.Lock()

    def replay(session_calls: list[_Call]) -> None:
        for c in session_calls:
            gen = engine.generate(c.messages, grammar=c.grammar, max_tokens=c.max_tokens)
            with lock:
                tokens.append(gen.usage.completion_tokens)

    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(replay, by_session.values()))
    return time.perf_counter() - started, sum(tokens)


def bench_serve(engine: Engine, sessions: Sequence[int], loop: Any,
                progress: Callable[[str], None] | None = None, apis: Sequence[str] = ("chat",)) -> list[dict[str, Any]]:
    """Rows per N and API: wall time and output tok/s through FlowState and direct, and their ratio (``loop``: the
    server's ``LoopConfig``); several APIs are measured one after the other at each N, so their rows compare."""
    unknown = set(apis) - set(APIS)
    if unknown:
        raise ValueError(f"unknown API {sorted(unknown)[0]!r}; valid: {', '.join(APIS)}")
    recorder = Recorder(engine)
    def reset() -> None:
        if engine.capabilities.prefix_cache_reset:
            engine.reset_prefix_cache()

    reset()
    _through_flowstate(recorder, 1, loop, apis[0])  # untimed: the engine warm, the request's grammar compiled
    rows = []
    for n in sessions:
        for api in apis:
            reset()
            first = len(recorder.calls)
            fs_wall, fs_tokens, failed = _through_flowstate(recorder, n, loop, api)
            calls = recorder.calls[first:]
            reset()
            direct_wall, direct_tokens = _direct(engine, calls, n)
            fs_rate, direct_rate = fs_tokens / fs_wall, direct_tokens / direct_wall
            rows.append({
                "api": api, "sessions": n, "model_calls": len(calls), "failed_turns": failed,
                "flowstate_s": round(fs_wall, 2), "flowstate_tokens": fs_tokens, "flowstate_tok_s": round(fs_rate, 1),
                "direct_s": round(direct_wall, 2), "direct_tokens": direct_tokens,
                "direct_tok_s": round(direct_rate, 1),
                "ratio": round(fs_rate / direct_rate, 3) if direct_rate else None,
            })
            if progress is not None:
                progress(f"{n} sessions, {api}: flowstate {fs_rate:.1f} tok/s, direct {direct_rate:.1f} tok/s")
    return rows


HEAD = ["api", "sessions", "model_calls", "failed_turns", "flowstate_s", "flowstate_tokens", "flowstate_tok_s",
        "direct_s", "direct_tokens",
        "direct_tok_s", "ratio"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
