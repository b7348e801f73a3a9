"""``flowstate serve --mcp``: a request that needs an MCP server's tool, through the official openai client, as any
other request; a client tool may not take an MCP tool's name."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import add, output
from tests.optional import skip_unless
from tests.serving.conftest import Server, lines

SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp" / "server.py"

pytestmark = [pytest.mark.slow, skip_unless("mcp", "the MCP SDK: pip install 'flowstate[mcp]'")]


def test_an_endpoint_request_uses_an_mcp_tool_through_the_openai_client(server: Server) -> None:
    script = lines("[mcp]", [
        output(tools=[{"name": "lookup", "arguments": {"key": "k7"}}]),
        output(delta=[add("record", refs=[("supports", "obs_r1_s1_1")], key="k7")], content="k7 is on record."),
    ])
    url = server.start(script, "--mcp", f"records={sys.executable} {SERVER}", "--mcp-scope", "session")
    api = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    reply = api.chat.completions.create(model="flowstate", user="ann",
                                        messages=[{"role": "user", "content": "[mcp] Is k7 on record?"}])
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content == "k7 is on record."
    assert reply.choices[0].message.tool_calls is None  # the server's own tool never reaches the client
    dump = httpx.get(f"{url}/sessions/ann", timeout=10).json()
    observation = next(n for n in dump["nodes"] if n["id"] == "obs_r1_s1_1")
    assert observation["value"]["tool"] == "lookup" and observation["value"]["result"]["key"] == "k7"
    assert isinstance(observation["value"]["result"]["pid"], int)  # what the MCP server process answered

    clash = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError, match="already server-side tools"):
        api.chat.completions.create(model="flowstate", user="ann", tools=[clash],  # type: ignore[list-item]
                                    messages=[{"role": "user", "content": "[mcp] again"}])


def test_serve_refuses_to_start_when_an_mcp_server_cannot(server: Server) -> None:
    with pytest.raises(RuntimeError, match="did not start"):
        server.start([], "--mcp", f"records={sys.executable} {SERVER} --fail-start")
    assert "cannot open the database" in server.log.read_text()
