"""OpenTelemetry traces: one turn's span tree with the SDK's in-memory exporter (exact names and parents, ISU and
PSA as events, the session hashed), nothing of the SDK loaded while tracing is off, and a real server's spans
arriving at a real OTLP/HTTP receiver under the caller's ``traceparent``."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository, tracing
from flowstate.demo import hotel
from tests.helpers import add, output

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SCRIPT = [json.loads(line)["text"] for line in hotel.script_path().read_text().splitlines() if line.strip()]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.enable(exporter=exporter, service="flowstate-test")
    try:
        yield exporter
    finally:
        tracing.disable()


def tree(finished: Any) -> dict[str, Any]:
    by_id = {s.context.span_id: s for s in finished}
    return {"by_id": by_id, "parent": {s.context.span_id: (s.parent.span_id if s.parent else None) for s in finished}}


def test_one_turn_s_span_tree(spans: InMemorySpanExporter, repo: Repository) -> None:
    agent = Agent(ScriptedEngine(SCRIPT), repository=repo, session="alice", tools=hotel.TOOLS,
                  task_policy=hotel.POLICY)
    record = agent.run(hotel.QUERIES[0])
    finished = spans.get_finished_spans()
    t = tree(finished)
    turns = [s for s in finished if s.name == "flowstate.turn"]
    assert len(turns) == 1 and t["parent"][turns[0].context.span_id] is None
    turn = turns[0]
    assert turn.attributes["flowstate.session"] == tracing.hashed("alice") != "alice"
    assert turn.attributes["flowstate.request"] == 1 and turn.attributes["flowstate.strategy"] == "flowstate"
    assert "alice" not in json.dumps([dict(s.attributes) for s in finished])  # the session's text is never sent
    steps = sorted((s for s in finished if s.name == "flowstate.step"), key=lambda s: s.attributes["flowstate.step"])
    assert [s.attributes["flowstate.step"] for s in steps] == list(range(1, len(record.steps) + 1))
    assert all(t["parent"][s.context.span_id] == turn.context.span_id for s in steps)
    for step, rec in zip(steps, record.steps, strict=True):
        children = [s for s in finished if t["parent"][s.context.span_id] == step.context.span_id]
        calls = [s for s in children if s.name == "flowstate.model_call"]
        tools = [s for s in children if s.name == "flowstate.tool_call"]
        assert len(calls) == 1 and calls[0].attributes["flowstate.purpose"] == "step"
        assert calls[0].attributes["flowstate.engine"] == "scripted"
        assert calls[0].attributes["gen_ai.usage.output_tokens"] == rec.usage.completion_tokens
        assert [s.attributes["flowstate.tool"] for s in tools] == [c.name for c in rec.tool_calls]
        assert all(s.start_time >= calls[0].end_time for s in tools)  # the step's calls run after its output
    assert {s.name for s in finished} == {"flowstate.turn", "flowstate.step", "flowstate.model_call",
                                          "flowstate.tool_call"}
    assert sum(s.name == "flowstate.tool_call" for s in finished) == sum(len(r.tool_calls) for r in record.steps) > 0


def test_isu_and_psa_are_events_of_their_step(spans: InMemorySpanExporter, repo: Repository) -> None:
    outputs = [output(delta=[add("pref_quiet", "preference", note="quiet"),
                             {"operation": "update", "state_id": "ghost", "summary": "nothing to update"}],
                      content="Noted."),
               output(focus=["pref_quiet", "not_there"]), output(content="Quiet rooms.")]
    agent = Agent(ScriptedEngine(outputs), repository=repo, session="bob")
    agent.run("[one] I like quiet rooms")
    spans.clear()
    agent.run("[two] what do I like?")
    events = {e.name: e for s in spans.get_finished_spans() if s.name == "flowstate.step" for e in s.events}
    assert events["flowstate.psa.disclosed"].attributes["flowstate.state_ids"] == ("pref_quiet",)
    assert events["flowstate.psa.refused"].attributes["target_id"] == "not_there"
    agent2 = Agent(ScriptedEngine(outputs[:1]), repository=repo, session="carol")
    spans.clear()
    agent2.run("[one] again")
    rejected = [e for s in spans.get_finished_spans() for e in s.events if e.name == "flowstate.isu.rejected"]
    assert len(rejected) == 1 and rejected[0].attributes["state_id"] == "ghost" and rejected[0].attributes["reason"]


def test_off_loads_nothing_of_the_sdk(tmp_path: Path) -> None:
    code = ("import sys\nfrom engine.scripted import ScriptedEngine\nfrom flowstate import Agent, Repository\n"
            "from tests.helpers import output\n"
            f"repo = Repository.open({str(tmp_path / 'off.db')!r})\n"
            "Agent(ScriptedEngine([output(content='hi')]), repository=repo, session='s').run('hello')\n"
            "import serving.app\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP traces receiver: each POST /v1/traces body decoded (protobuf) and kept."""

    got: list[Any] = []

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        type(self).got.append((self.path, message))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.slow
def test_a_server_s_trace_reaches_a_real_receiver(tmp_path: Path) -> None:
    from tests.serving.conftest import Server

    _Receiver.got = []
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    server = Server(tmp_path)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    try:
        url = server.start([{"text": output(content="Hello.")}], "--otlp-endpoint",
                           f"http://127.0.0.1:{receiver.server_address[1]}",
                           env={"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "flowstate-under-test"})
        r = httpx.post(f"{url}/chat/completions", json={"model": "flowstate", "user": "dora", "messages": [
            {"role": "user", "content": "hi"}]}, headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}, timeout=60)
        assert r.status_code == 200, r.text
        deadline = time.time() + 30
        names: dict[str, Any] = {}
        while time.time() < deadline and "flowstate.model_call" not in names:
            time.sleep(0.2)
            names = {s.name: s for _, m in list(_Receiver.got) for rs in m.resource_spans for ss in rs.scope_spans
                     for s in ss.spans}
    finally:
        server.stop()
        receiver.shutdown()
    assert {path for path, _ in _Receiver.got} == {"/v1/traces"}
    http_span = names["POST /v1/chat/completions"]
    assert http_span.trace_id.hex() == trace_id and http_span.parent_span_id.hex() == parent_id
    turn, step, call = names["flowstate.turn"], names["flowstate.step"], names["flowstate.model_call"]
    assert turn.parent_span_id == http_span.span_id and step.parent_span_id == turn.span_id
    assert call.parent_span_id == step.span_id and call.trace_id.hex() == trace_id
    resource = {a.key: a.value.string_value for _, m in _Receiver.got for rs in m.resource_spans
                for a in rs.resource.attributes}
    assert resource["service.name"] == "flowstate-under-test"
    assert "dora" not in str([s.attributes for s in names.values()])


def test_the_openai_engine_sends_traceparent_on(repo: Repository) -> None:
    """The model call's own span is the parent the OpenAI-compatible server gets (vLLM's spans join the trace); with
    tracing off, no header is sent."""
    import engine as engines
    from tests.engine.openai_stub import send_completion

    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("traceparent"))
            send_completion(self, output(content="hi"), 50, 0)

    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    try:
        model = engines.load("openai", base_url=f"http://127.0.0.1:{stub.server_address[1]}/v1", model="m")
        exporter = InMemorySpanExporter()
        tracing.enable(exporter=exporter)
        try:
            Agent(model, repository=repo, session="gus").run("hello")
        finally:
            tracing.disable()
        Agent(model, repository=repo, session="hal").run("hello")  # tracing off
    finally:
        stub.shutdown()
    call = next(s for s in exporter.get_finished_spans() if s.name == "flowstate.model_call")
    assert seen[0] is not None and seen[0].startswith(f"00-{call.context.trace_id:032x}-{call.context.span_id:016x}-")
    assert seen[1:] == [None]


@pytest.mark.parametrize(("variables", "sent_to"), [
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/v1/traces"}, "http://traces:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://all:4318"}, "http://all:4318"),  # enable() adds /v1/traces
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://all:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/v1/traces"},
     "http://t:1/v1/traces"),  # the traces variable wins, as in OpenTelemetry
    ({}, None),
])
def test_opentelemetrys_variables_turn_tracing_on(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str],
                                                   sent_to: str | None) -> None:
    """What docs/deployment.md says is read is read: each variable alone turns tracing on, to where it says."""
    from flowstate import tracing
    from flowstate.cli.options import traced

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    seen: list[str | None] = []
    monkeypatch.setattr(tracing, "enable", lambda endpoint=None, **_: seen.append(endpoint))
    monkeypatch.setattr(tracing, "disable", lambda: None)
    with traced(None):
        pass
    assert seen == ([] if sent_to is None else [sent_to])
