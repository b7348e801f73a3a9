"""Tools from MCP servers: listed into the configuration, dispatched per session, and every fault a tool error the
model is told (or a clear error at start), the request stored whole. The server is tests/fixtures/mcp/server.py,
written with the official SDK (``--raw``: one that breaks the protocol)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.scripted import ScriptedEngine
from flowstate import Agent
from flowstate.config import AgentConfig
from flowstate.errors import ToolLoadError
from flowstate.mcp import McpSource, connect
from flowstate.memory.state import FLOWSTATE
from flowstate.store.repository import Repository
from flowstate.tools import Tool, ToolSet
from tests.helpers import output
from tests.optional import skip_unless

SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp" / "server.py"
COMMAND = f"{sys.executable} {SERVER}"
pytestmark = skip_unless("mcp", "the MCP SDK: pip install -e '.[mcp]'")


@pytest.fixture(scope="module")
def shared() -> Iterator[ToolSet]:
    with connect([f"t={COMMAND}"], timeout=20) as tools:
        yield tools


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def test_a_servers_tools_reach_the_prompt_and_the_grammar_as_python_tools_do(shared: ToolSet) -> None:
    assert list(shared) == ["add", "count", "lookup", "fail", "hang", "die", "image"]
    add = shared["add"].spec()
    assert add["description"] == "Add two whole numbers."
    assert add["parameters"]["properties"]["a"] == {"description": "A whole number.", "title": "A", "type": "integer"}
    assert add["parameters"]["required"] == ["a", "b"]
    config = AgentConfig(ScriptedEngine([], grammar=True), FLOWSTATE, tools=shared)
    system = config.system_prompt()
    assert "Add two whole numbers." in system and '"lookup"' in system
    grammars = config.grammars(config.specs(), validate=True)
    assert grammars is not None  # the input schemas compile, closed to their properties
    assert [n for n in shared if shared.read_only(n)] == ["lookup"]  # its readOnlyHint; the rest may change things
    assert shared.call("add", {"a": 2, "b": 3, "c": 1})[1] == \
        "invalid arguments for add: arguments: Additional properties are not allowed ('c' was unexpected)"
    assert shared.call("add", {"a": "two", "b": 3})[1] == "invalid arguments for add: a: 'two' is not of type 'integer'"


def test_a_call_is_dispatched_and_its_result_is_the_observation(shared: ToolSet) -> None:
    assert shared.call("add", {"a": 2, "b": 3}) == ({"result": 5}, None)  # structured content
    found, error = shared.call("lookup", {"key": "k1"})  # text content that is JSON
    assert error is None and found["key"] == "k1" and found["tags"] == ["a", "b"]
    assert shared.call("fail", {"message": "no such flight"}) == (None, "Error executing tool fail: no such flight")
    result, error = shared.call("image", {})
    assert result is None and error == "the tool returned image content, which cannot be shown to the model as text"


def test_names_that_clash_are_refused_at_start() -> None:
    with pytest.raises(ToolLoadError, match="tool 'add' of MCP source 'b' has the name of a tool of MCP source 'a'"):
        connect([f"a={COMMAND}", f"b={COMMAND}"])

    def add(a: int) -> int:
        """Python's add."""
        return a

    with pytest.raises(ToolLoadError, match="tool 'add' of MCP source 'a' has the name of a tool of the Python tools"):
        connect([f"a={COMMAND}"], base=ToolSet([Tool.from_function(add)]))
    with pytest.raises(ToolLoadError, match="two MCP sources are named 'a'"):
        connect([f"a={COMMAND}", f"a={COMMAND} --http 1"])
    with pytest.raises(ValueError, match="NAME=COMMAND or NAME=URL"):
        connect(["no-command"])


def test_a_server_that_does_not_start_is_a_clear_error_at_start() -> None:
    with pytest.raises(ToolLoadError, match=r"did not start .*its stderr ends: cannot open the database"):
        connect([f"t={COMMAND} --fail-start"])
    with pytest.raises(ToolLoadError, match=r"MCP server t=/nonexistent/server did not start"):
        connect(["t=/nonexistent/server"])


def agent_with(tools: ToolSet, tmp_path: Path, outputs: list[str], session: str = "s") -> tuple[Agent, Repository]:
    repo = Repository.open(tmp_path / "m.db")
    return Agent(ScriptedEngine(outputs), repository=repo, session=session, tools=tools), repo


def stored_whole(repo: Repository, session: str) -> dict[str, Any]:
    """The session's one request, stored finished: its record."""
    requests = repo.requests(session)
    assert len(requests) == 1 and requests[0].response == "done" and requests[0].unfinished is None
    record = repo.records.request(session, 1)
    assert record is not None
    return record


def tool_calls(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for s in record["steps"] for c in s["tool_calls"]]


def test_a_server_that_dies_mid_request_is_a_tool_error_and_restarts_on_the_next_call(tmp_path: Path) -> None:
    with connect([f"t={COMMAND}"], timeout=20) as tools:
        agent, repo = agent_with(tools, tmp_path, [output(tools=[call("count")]), output(tools=[call("die")]),
                                                   output(tools=[call("count")]), output(content="done")])
        record = agent.run("count, crash, count").to_dict()
        first, died, again = tool_calls(record)
        assert first["result"] == {"result": 1}
        assert "MCP server 't' ended during die" in died["error"] and "restarted on the next call" in died["error"]
        assert again["result"] == {"result": 1}  # a new process
        assert tools.sources[0].restarts == 1  # type: ignore[attr-defined]
        assert tool_calls(stored_whole(repo, "s")) == [first, died, again]
        repo.close()


def test_a_hanging_call_times_out_and_the_server_is_restarted(tmp_path: Path) -> None:
    with connect([f"t={COMMAND}"], timeout=1.5) as tools:
        agent, repo = agent_with(tools, tmp_path, [output(tools=[call("count")]), output(tools=[call("hang")]),
                                                   output(tools=[call("count")]), output(content="done")])
        started = time.monotonic()
        record = agent.run("count, hang, count").to_dict()
        assert time.monotonic() - started < 30  # not the hour the tool sleeps
        _, hung, again = tool_calls(record)
        assert hung["error"] == "MCP server 't' did not answer hang within 1.5 s; it is restarted on the next call"
        assert again["result"] == {"result": 1}
        stored_whole(repo, "s")
        repo.close()


def test_a_server_that_breaks_the_protocol_is_a_tool_error_then_a_new_connection(tmp_path: Path) -> None:
    with connect([f"r={COMMAND} --raw"], timeout=5) as tools:
        source = tools.sources[0]
        result, error = tools.call("broken", {})
        assert result is None and error is not None
        assert error.startswith("MCP server 'r' failed broken") and "a malformed CallToolResult (content:" in error
        assert tools.call("noise", {}) == ("after the noise", None)  # the SDK skips the stray line and says so ...
        deadline = time.monotonic() + 5
        while source.live and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.05)
        assert tools.call("noise", {}) == ("after the noise", None)  # ... and the stream is not trusted again
        assert source.restarts == 1  # type: ignore[attr-defined]


def test_session_scope_keeps_one_server_per_session_and_server_scope_one_for_all(tmp_path: Path) -> None:
    with connect([f"t={COMMAND}"], scope="session", timeout=20) as tools:
        counts = [tools.call("count", {}, s)[0]["result"] for s in ("a", "a", "b", "a", "b")]
        assert counts == [1, 2, 1, 3, 2]
        pids = {s: tools.call("lookup", {"key": "x"}, s)[0]["pid"] for s in ("a", "b")}
        assert pids["a"] != pids["b"]
        tools.release("a")  # the session left memory: its server ends
        assert tools.call("count", {}, "a")[0]["result"] == 1
        assert tools.call("count", {}, "b")[0]["result"] == 3
    with connect([f"t={COMMAND}"], scope="server", timeout=20) as tools:
        assert [tools.call("count", {}, s)[0]["result"] for s in ("a", "b", "a")] == [1, 2, 3]
        tools.release("a")  # nothing of a shared server is a session's
        assert tools.call("count", {}, "b")[0]["result"] == 4


def test_per_session_servers_stay_within_the_bound_least_recently_used_released_first() -> None:
    with connect([f"t={COMMAND}"], scope="session", timeout=20, max_sessions=2) as tools:
        source = tools.sources[0]
        assert [tools.call("count", {}, s)[0]["result"] for s in ("a", "b", "a")] == [1, 1, 2]
        assert tools.call("count", {}, "c")[0]["result"] == 1  # b was the least recently used: it ends
        assert source.live <= 2 and source.released == 1
        assert tools.call("count", {}, "a")[0]["result"] == 3  # a kept its server
        assert tools.call("count", {}, "b")[0]["result"] == 1  # b's next call works, on a fresh server
        assert source.released == 2 and source.restarts == 0  # released, not restarted: nothing died

        tools.hold_while(lambda s: s == "a")  # a turn of a runs: its server is not the one to go
        assert tools.call("count", {}, "d")[0]["result"] == 1  # a is the oldest, but held: b goes instead
        assert tools.call("count", {}, "a")[0]["result"] == 4
        tools.hold_while(lambda s: True)  # every live session in a running turn: nothing may end
        result, error = tools.call("count", {}, "e")
        assert result is None and error is not None and "held by running turns" in error and "--mcp-sessions" in error
        assert source.live == 2


def test_each_session_of_the_loop_reaches_its_own_server(tmp_path: Path) -> None:
    with connect([f"t={COMMAND}"], scope="session", timeout=20) as tools:
        repo = Repository.open(tmp_path / "m.db")
        for session in ("alice", "bob"):
            engine = ScriptedEngine([output(tools=[call("count")]), output(content="done")])
            Agent(engine, repository=repo, session=session, tools=tools).run("count")
        engine = ScriptedEngine([output(tools=[call("count")]), output(content="done")])
        record = Agent(engine, repository=repo, session="alice", tools=tools).run("count again").to_dict()
        assert tool_calls(record)[0]["result"] == {"result": 2}
        assert tool_calls(repo.records.request("bob", 1) or {})[0]["result"] == {"result": 1}
        repo.close()


@pytest.fixture
def http_server() -> Iterator[str]:
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


def test_a_streamable_http_server_is_a_source_too(http_server: str) -> None:
    with connect([f"web={http_server}"], timeout=20) as tools:
        assert "add" in tools and tools.call("add", {"a": 20, "b": 22}) == ({"result": 42}, None)
        source = tools.sources[0]
        assert isinstance(source, McpSource) and source.server.url == http_server
    with pytest.raises(ToolLoadError, match="MCP server web=http://127.0.0.1:9/mcp did not start"):
        connect(["web=http://127.0.0.1:9/mcp"], timeout=5)


def test_a_malformed_result_inside_a_request_is_fed_back_and_the_request_stored_whole(tmp_path: Path) -> None:
    with connect([f"r={COMMAND} --raw"], timeout=5) as tools:
        agent, repo = agent_with(tools, tmp_path, [output(tools=[call("broken")]), output(content="done")])
        (broken,) = tool_calls(agent.run("call the broken tool").to_dict())
        assert "a malformed CallToolResult" in broken["error"]
        assert tool_calls(stored_whole(repo, "s")) == [broken]
        repo.close()


def test_flowstate_run_takes_mcp_tools(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from flowstate.cli import main

    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps({"text": t}) + "\n" for t in [
        output(tools=[call("add", a=40, b=2)]), output(content="done")]))
    result = CliRunner().invoke(main, ["run", "add them", "--db", str(tmp_path / "m.db"), "--engine", "scripted",
                                       "--script", str(script), "--mcp", f"t={COMMAND}", "--json"])
    assert result.exit_code == 0, result.output
    assert tool_calls(json.loads(result.output)) == [
        {"name": "add", "arguments": {"a": 40, "b": 2}, "observation_id": "obs_r1_s1_1", "result": {"result": 42}}]
    failed = CliRunner().invoke(main, ["run", "q", "--db", str(tmp_path / "m.db"), "--engine", "scripted",
                                       "--script", str(script), "--mcp", f"t={COMMAND} --fail-start"])
    assert failed.exit_code == 1 and "did not start" in failed.output and "cannot open the database" in failed.output


def test_one_shared_server_answers_concurrent_sessions_each_their_own_call(shared: ToolSet) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: shared.call("add", {"a": i, "b": 1000}, f"s{i}"), range(32)))
    assert results == [({"result": i + 1000}, None) for i in range(32)]
