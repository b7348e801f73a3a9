"""``flowstate serve --mcp``: a request that needs an MCP server's tool, through the official openai client, as any
other request; a client tool may not take an MCP tool's name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import add, output
from tests.optional import skip_unless
from tests.serving.conftest import Server, lines

SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp" / "server.py"

pytestmark = [pytest.mark.slow, skip_unless("mcp", "the MCP SDK: pip install -e '.[mcp]'")]


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
    # ann's own server process, within the bound
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    assert 'flowstate_mcp_connections{server="records"} 1.0' in metrics
    assert 'flowstate_mcp_released{server="records"} 0.0' in metrics

    clash = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError, match="already server-side tools"):
        api.chat.completions.create(model="flowstate", user="ann", tools=[clash],  # type: ignore[list-item]
                                    messages=[{"role": "user", "content": "[mcp] again"}])


def test_serve_refuses_to_start_when_an_mcp_server_cannot(server: Server) -> None:
    with pytest.raises(RuntimeError, match="did not start"):
        server.start([], "--mcp", f"records={sys.executable} {SERVER} --fail-start")
    assert "cannot open the database" in server.log.read_text()


def test_a_response_names_a_configured_mcp_server_and_shows_its_calls(server: Server) -> None:
    """Responses' ``mcp`` tool selects a server the operator runs (``--mcp``): its tools listed and its calls shown
    as ``mcp_list_tools`` and ``mcp_call`` items, streamed or not; a label it does not run, or a malformed
    ``require_approval``, is a 400 — a request's server_url is never dialled."""
    script = lines("[mcp-r]", [
        output(tools=[{"name": "lookup", "arguments": {"key": "k7"}}]), output(content="k7 is on record."),
        output(tools=[{"name": "lookup", "arguments": {"key": "k8"}}]), output(content="k8 is on record."),
    ])
    url = server.start(script, "--mcp", f"records={sys.executable} {SERVER}")
    api = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    records = {"type": "mcp", "server_label": "records", "server_url": "http://127.0.0.1:9/never",
               "require_approval": "never"}
    r = api.responses.create(model="flowstate", conversation="mcp", input="[mcp-r] Is k7 on record?", tools=[records])
    listed, call, answer = r.output
    assert listed.type == "mcp_list_tools" and "lookup" in [t.name for t in listed.tools]
    assert (call.type, call.server_label, call.name, call.status) == ("mcp_call", "records", "lookup", "completed")
    assert json.loads(call.arguments) == {"key": "k7"} and json.loads(call.output)["key"] == "k7"
    assert answer.type == "message" and r.output_text == "k7 is on record."
    with api.responses.stream(model="flowstate", conversation="mcp", input="[mcp-r] And k8?", tools=[records]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert [i.type for i in final.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert kinds.count("response.output_item.done") == 3 and kinds[-1] == "response.completed"
    for bad, match in (({**records, "server_label": "elsewhere"}, "no MCP server 'elsewhere'"),
                       ({**records, "require_approval": {"sometimes": {}}}, "require_approval is")):
        with pytest.raises(openai.BadRequestError, match=match):
            api.responses.create(model="flowstate", input="[mcp-r] x", tools=[bad])


def test_an_mcp_call_that_needs_approval_waits_for_the_clients_answer(server: Server) -> None:
    """``require_approval`` (default "always"): the model's call of the MCP tool ends the response with an
    ``mcp_approval_request``; the next request answers it with an ``mcp_approval_response`` — approved, the server
    runs the call (an ``mcp_call`` naming the approval) and the request goes on; refused, the model is told so and
    answers without it. A tool named under ``never`` runs at once."""
    script = lines("[mcp-p]", [
        output(tools=[{"name": "lookup", "arguments": {"key": "k7"}}]), output(content="k7 is on record."),
        output(tools=[{"name": "lookup", "arguments": {"key": "k9"}}]), output(content="I may not look k9 up."),
        output(tools=[{"name": "lookup", "arguments": {"key": "k3"}}]), output(content="k3 is on record."),
    ])
    url = server.start(script, "--mcp", f"records={sys.executable} {SERVER}")
    api = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    records: dict[str, object] = {"type": "mcp", "server_label": "records"}  # approvals: OpenAI's default
    with api.responses.stream(model="flowstate", input="[mcp-p] Is k7 on record?", tools=[records]) as s:  # type: ignore[list-item]
        kinds = [e.type for e in s]
        asked = s.get_final_response()
    request = asked.output[-1]
    assert request.type == "mcp_approval_request" and (request.server_label, request.name) == ("records", "lookup")  # type: ignore[union-attr]
    assert json.loads(request.arguments) == {"key": "k7"} and kinds[-1] == "response.completed"  # type: ignore[union-attr]
    assert "mcp_call" not in [i.type for i in asked.output]  # nothing ran yet
    for bad, match in (([{"type": "function_call_output", "call_id": request.id.removeprefix("mcpr_"), "output": "x"}],  # type: ignore[union-attr]
                        "waits on an mcp_approval_response"),
                       ([{"type": "mcp_approval_response", "approval_request_id": "nope", "approve": True}],
                        "approval_request_id")):
        with pytest.raises(openai.BadRequestError, match=match):
            api.responses.create(model="flowstate", previous_response_id=asked.id, input=bad, tools=[records])  # type: ignore[arg-type, list-item]
    approved = api.responses.create(model="flowstate", previous_response_id=asked.id, tools=[records],  # type: ignore[list-item]
                                    input=[{"type": "mcp_approval_response", "approval_request_id": request.id,  # type: ignore[union-attr]
                                            "approve": True}])
    call = next(i for i in approved.output if i.type == "mcp_call")
    assert call.approval_request_id == request.id and json.loads(call.output)["key"] == "k7"  # type: ignore[union-attr]
    assert approved.output_text == "k7 is on record."

    asked = api.responses.create(model="flowstate", previous_response_id=approved.id, input="[mcp-p] And k9?",  # type: ignore[list-item]
                                 tools=[records])
    request = asked.output[-1]
    refused = api.responses.create(model="flowstate", previous_response_id=asked.id, tools=[records],  # type: ignore[list-item]
                                   input=[{"type": "mcp_approval_response", "approval_request_id": request.id,  # type: ignore[union-attr]
                                           "approve": False, "reason": "not k9"}])
    call = next(i for i in refused.output if i.type == "mcp_call")
    assert call.status == "failed" and call.error == "the user did not approve this call: not k9"  # type: ignore[union-attr]
    assert refused.output_text == "I may not look k9 up."

    trusted = {**records, "require_approval": {"never": {"tool_names": ["lookup"]}}}
    direct = api.responses.create(model="flowstate", previous_response_id=refused.id, input="[mcp-p] And k3?",  # type: ignore[list-item]
                                  tools=[trusted])
    assert [i.type for i in direct.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert direct.output_text == "k3 is on record."


def test_a_responses_mcp_tools_allowed_tools_keep_only_those_callable(server: Server) -> None:
    """``allowed_tools`` on an mcp tool: only those of the server are listed and callable in that request; a call
    of another is refused and fed back (the grammar leaves it out where the engine decodes under one), a later
    request without the filter calls it again; a name the server lacks, or a read_only filter, is a 400."""
    script = lines("[mcp-a]", [
        output(tools=[{"name": "add", "arguments": {"a": 1, "b": 2}}]),  # hidden in this request: refused
        output(tools=[{"name": "lookup", "arguments": {"key": "k1"}}]), output(content="k1 looked up."),
        output(tools=[{"name": "add", "arguments": {"a": 1, "b": 2}}]), output(content="3."),
    ])
    url = server.start(script, "--mcp", f"records={sys.executable} {SERVER}")
    api = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    records: dict[str, object] = {"type": "mcp", "server_label": "records", "require_approval": "never"}
    only = {**records, "allowed_tools": ["lookup"]}
    r = api.responses.create(model="flowstate", conversation="mcp-a", input="[mcp-a] Look k1 up.", tools=[only])  # type: ignore[list-item]
    listed = r.output[0]
    assert listed.type == "mcp_list_tools" and [t.name for t in listed.tools] == ["lookup"]  # type: ignore[union-attr]
    assert [i.name for i in r.output if i.type == "mcp_call"] == ["lookup"] and r.output_text == "k1 looked up."  # type: ignore[union-attr]
    steps = (r.model_extra or {})["flowstate"]["steps"]
    assert "not among this request's allowed tools" in json.dumps(steps)  # the add was refused and said so
    again = api.responses.create(model="flowstate", conversation="mcp-a", input="[mcp-a] Add 1 and 2.", tools=[records])  # type: ignore[list-item]
    assert [i.name for i in again.output if i.type == "mcp_call"] == ["add"] and again.output_text == "3."  # type: ignore[union-attr]
    for bad, match in (({**records, "allowed_tools": ["nope"]}, "does not have"),
                       ({**records, "allowed_tools": {"read_only": True}}, "read_only")):
        with pytest.raises(openai.BadRequestError, match=match):
            api.responses.create(model="flowstate", input="[mcp-a] x", tools=[bad])  # type: ignore[list-item]
