"""Codex CLI (``@openai/codex`` 0.169, which speaks only the Responses API) against a real ``flowstate serve``:
``codex exec`` runs a turn whose model calls Codex's own ``exec_command`` tool, Codex runs it and resends the whole
conversation with the result (``store: false``, no ``previous_response_id``), and the endpoint recognises the
resent history: one session, one request, the tool result in it, the answer printed. CI installs Codex from npm
and names it in FLOWSTATE_CODEX (FLOWSTATE_REQUIRE_CODEX=1); elsewhere the test is skipped and says so."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flowstate import Repository
from tests.helpers import output
from tests.optional import command
from tests.serving.conftest import Server

CODEX = command("FLOWSTATE_CODEX", "FLOWSTATE_REQUIRE_CODEX")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CODEX is None, reason="needs Codex CLI: npm install "
                                                   "@openai/codex@0.169.1, then FLOWSTATE_CODEX=<its bin/codex>")]


def codex(url: str, home: Path, workdir: Path, prompt: str) -> list[dict[str, object]]:
    """``codex exec --json`` on FlowState as its model provider; its events."""
    provider = (f'model_providers.flowstate={{name="FlowState", base_url="{url}", env_key="FLOWSTATE_KEY", '
                'wire_api="responses", request_max_retries=0, stream_max_retries=0}')
    assert CODEX is not None
    done = subprocess.run([CODEX, "exec", "--skip-git-repo-check", "--json", "-C", str(workdir),
                           "-c", "model_provider=flowstate", "-c", provider, "-m", "flowstate", prompt],
                          env={**os.environ, "CODEX_HOME": str(home), "FLOWSTATE_KEY": "none"},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_codex_runs_a_tool_turn_on_flowstate_and_the_resent_history_continues_one_session(tmp_path: Path) -> None:
    server = Server(tmp_path)
    script = [{"text": output(tools=[{"name": "exec_command", "arguments": {"cmd": "echo flowstate-ok"}}])},
              {"text": output(content="The command printed flowstate-ok.")}]
    url = server.start(script)
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    try:
        events = codex(url, tmp_path / "home", tmp_path / "work", "Run echo flowstate-ok and tell me what it printed")
    finally:
        server.stop()
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    ran = [i for i in items if i.get("type") == "command_execution"]
    assert ran and "echo flowstate-ok" in str(ran[0]["command"]) and "flowstate-ok" in str(ran[0]["aggregated_output"])
    assert [i["text"] for i in items if i.get("type") == "agent_message"] == ["The command printed flowstate-ok."]
    assert any(e.get("type") == "turn.completed" for e in events)
    with Repository.open(server.db) as repo:
        (session,) = repo.sessions("")  # Codex's second call resent everything: recognised, not a new session
        (request,) = repo.requests(session)
        assert request.response == "The command printed flowstate-ok."
        record = repo.records.request(session, 1) or {}
        calls = [c for step in record.get("steps", []) for c in step.get("tool_calls", [])]
        assert [c["name"] for c in calls] == ["exec_command"] and "flowstate-ok" in json.dumps(calls[0]["result"])
