"""Traces of an evaluation's model calls, and their replay against an OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from flowstate.bench.trace import bench_trace, scrape
from flowstate.eval.rows import TaskRow, calls_of
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.eval.trace import read
from tests.engine.openai_stub import send
from tests.flowstate.eval.test_replay import conversation


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    path = tmp_path / "airline.json"
    path.write_text(json.dumps([{"task_id": 0, "traj": conversation("mia_li_3668", "ABC123")},
                                {"task_id": 1, "traj": conversation("ivan_m_1", "XYZ789")}]))
    return path


def traced_eval(recording: Path, out: Path, trace: Path) -> list[TaskRow]:
    config = EvalConfig(suites=("tau-replay",), strategies=("flowstate", "full-context"), tasks=2, depth=1, out=out,
                        policy="realistic", replay=str(recording), trace=str(trace))
    return run_eval(config, [])


def test_every_call_of_every_session_is_recorded_once_with_its_messages(recording: Path, tmp_path: Path) -> None:
    rows = traced_eval(recording, tmp_path / "ev", tmp_path / "trace.jsonl")
    traces = read(tmp_path / "trace.jsonl")
    assert set(traces) == {"flowstate", "full-context"} and all(len(s) == 2 for s in traces.values())
    for row in rows:
        calls = traces[row.strategy][f"tau-replay/{row.strategy}/{row.task}"]
        recorded = calls_of(row.subtasks)
        assert [c.order for c in calls] == list(range(len(recorded)))
        assert [c.completion_tokens for c in calls] == [c.completion_tokens for c in recorded]
        assert calls[0].messages[0].role == "system" and "Airline Agent Policy" in calls[0].messages[0].content
    # the chat grows by appending: full context's later calls start with its earlier calls' messages
    chat = next(iter(traces["full-context"].values()))
    assert chat[-1].messages[: len(chat[0].messages)] == chat[0].messages
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    texts = [line["content"] for line in lines if "text" in line]
    assert len(texts) == len(set(texts))  # each text once, however many calls send it


def test_each_call_keeps_its_output_and_grammar_and_an_older_trace_reads_without(recording: Path,
                                                                                  tmp_path: Path) -> None:
    from engine.base import Generation, Message, Usage
    from flowstate.eval.trace import TraceWriter

    traced_eval(recording, tmp_path / "ev", tmp_path / "trace.jsonl")
    flow = next(iter(read(tmp_path / "trace.jsonl")["flowstate"].values()))
    # the method's steps emit the protocol's blocks; what the call decoded is kept as it came
    assert all(c.output is not None for c in flow) and any("<state_delta>" in (c.output or "") for c in flow)
    writer = TraceWriter(tmp_path / "g.jsonl")
    grammar = 'start: "a"+'
    for _ in range(2):
        writer.record("s", {"strategy": "x"}, [Message("user", "hi")], Generation("aaa", Usage(3, 0, 3)), grammar)
    calls = read(tmp_path / "g.jsonl")["x"]["s"]
    assert [(c.output, c.grammar) for c in calls] == [("aaa", grammar)] * 2
    assert sum('"content"' in line for line in (tmp_path / "g.jsonl").read_text().splitlines()) == 3  # hi, aaa, grammar
    (tmp_path / "old.jsonl").write_text('{"text": "k", "content": "hi"}\n{"session": "s", "order": 0, '
                                        '"messages": [["user", "k"]], "completion_tokens": 3}\n')
    old = read(tmp_path / "old.jsonl")[""]["s"][0]
    assert (old.output, old.grammar, old.completion_tokens) == (None, None, 3)


def test_a_trace_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no trace at"):
        read(tmp_path / "absent.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"session": "s", "order": 0, "messages": [["user", "nope"]], '
                                        '"completion_tokens": 3}\n')
    with pytest.raises(ValueError, match="names a text the trace does not hold"):
        read(tmp_path / "bad.jsonl")


class Stub(BaseHTTPRequestHandler):
    """A server that streams as many tokens as it is asked for and counts prefix-cache figures as vLLM names them."""

    bodies: list[dict[str, Any]] = []
    counters = {"queries": 0, "hits": 0}
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            send(self, json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": 0,
                                                               "owned_by": "x"}]}).encode(), "application/json")
            return
        c = self.counters
        metrics = (f'vllm:prefix_cache_queries_total{{engine="0"}} {c["queries"]}\n'
                   f'vllm:prefix_cache_hits_total{{engine="0"}} {c["hits"]}\nvllm:num_preemptions_total 0\n')
        send(self, metrics.encode(), "text/plain")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.bodies.append(body)
            self.counters["queries"] += 100
            self.counters["hits"] += 60
        n = body["max_tokens"]
        base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        events = [{**base, "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}] * n
        events.append({**base, "choices": [],
                       "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}})
        send(self, b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n",
             "text/event-stream")


@pytest.fixture
def stub() -> Iterator[str]:
    Stub.bodies, Stub.counters = [], {"queries": 0, "hits": 0}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_a_replay_forces_the_recorded_lengths_keeps_each_sessions_order_and_reads_the_servers_counters(
        recording: Path, tmp_path: Path, stub: str) -> None:
    traced_eval(recording, tmp_path / "ev", tmp_path / "trace.jsonl")
    traces = read(tmp_path / "trace.jsonl")
    assert scrape(stub) == {"queries": 0, "hits": 0, "preemptions": 0}
    client = OpenAI(base_url=stub, api_key="none", max_retries=0)
    rows = bench_trace(traces, client, "m", stub, [2])
    assert [r["strategy"] for r in rows] == ["flowstate", "full-context"]
    for row in rows:
        calls = [c for s in traces[row["strategy"]].values() for c in s]
        assert row["calls"] == len(calls) and row["output_tokens"] == row["recorded_tokens"] == sum(
            c.completion_tokens for c in calls)
        assert row["prefix_hit_rate"] == 0.6 and row["preemptions"] == 0 and row["concurrency"] == 2
    assert all(b["max_tokens"] == b["min_tokens"] and b["ignore_eos"] is True and b["stream"] for b in Stub.bodies)
    # a session's calls arrive in their order: full context's chat of one session (known by its first query) grows
    for session in traces["full-context"].values():
        first = session[0].messages[1].content
        arrived = [b["messages"] for b in Stub.bodies if len(b["messages"]) > 1
                   and b["messages"][1]["content"] == first]
        assert [len(m) for m in arrived] == [len(c.messages) for c in session]
        assert all(later[: len(earlier)] == earlier for earlier, later in zip(arrived, arrived[1:]))
    assert scrape("http://127.0.0.1:1/v1") == {}  # no server: no counters, not an error


def test_a_calls_forced_tokens_are_recorded_where_the_engine_counts_them(tmp_path: Path) -> None:
    """What the call's grammar forced travels with the trace (``bench capacity --fast-forward`` appends them); a
    call without any writes no field and reads 0."""
    from engine.base import Generation, Message, Usage
    from flowstate.eval.trace import TraceWriter

    writer = TraceWriter(tmp_path / "t.jsonl")
    writer.record("s", {"strategy": "flowstate"}, [Message("user", "hi")],
                  Generation("", Usage(completion_tokens=10, forced_tokens=4)))
    writer.record("s", {"strategy": "flowstate"}, [Message("user", "again")],
                  Generation("", Usage(completion_tokens=3)))
    calls = read(tmp_path / "t.jsonl")["flowstate"]["s"]
    assert [(c.completion_tokens, c.forced_tokens) for c in calls] == [(10, 4), (3, 0)]
    assert "forced_tokens" not in (tmp_path / "t.jsonl").read_text().splitlines()[-1]
