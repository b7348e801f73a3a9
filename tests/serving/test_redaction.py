"""Redaction on a real server (``--redact mask``) with the official ``openai`` client: the turn that received an
e-mail address and a card number answers with them, while nothing the server stores, indexes, shows or exports holds
them (the raw SQLite file included); a later request's tool call that names the address by its placeholder reaches
the tool with the address; after a restart the client's resent history, real values and all, still continues its
session; what was redacted is counted per request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai

from flowstate.bench.redaction import SECRET_FORMATS
from flowstate.store.redaction import Detector, Redactor
from flowstate.store.vault import Vault, new_key
from tests.helpers import add, output
from tests.serving.conftest import Server, lines

EMAIL, CARD = "mia.li3818@example.com", "4111 1111 1111 1111"
SECRETS = (SECRET_FORMATS["github fine-grained token"][0][0][1], SECRET_FORMATS["aws secret access key"][0][0][1],
           SECRET_FORMATS["sk- api key (OpenAI, Anthropic, others)"][0][0][1])  # github_pat_…, AWS's, sk-proj-…
TOOLS = ("--tools", "tests.serving.vault_tools:TOOLS")


def placeholder(key: str, value: str, kind: str = "email") -> str:
    """What the server writes for ``value`` on an open server (namespace '')."""
    return Redactor(Detector(), Vault(None, key).digest_key).placeholder("", kind, value)  # type: ignore[arg-type]


def test_values_reach_the_turn_and_the_tool_and_nothing_stored(server: Server, tmp_path: Path) -> None:
    key, log = new_key(), tmp_path / "tool.log"
    ph = placeholder(key, EMAIL)
    script = (lines("[t1]", [output(delta=[add("kn_contact", "attribute", email=EMAIL)], content=f"Noted {EMAIL}.")])
              + lines("[t2]", [output(tools=[{"name": "send_email", "arguments": {"to": ph, "body": "confirmed"}}]),
                               output(content="Sent.")])
)
    args = ("--redact", "mask", "--vault-key", key, *TOOLS)
    url = server.start(script, *args, env={"FLOWSTATE_TEST_TOOL_LOG": str(log)})
    api = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    pat, aws, sk = SECRETS  # written as people write them: a token, an unquoted assignment, a key in prose
    said = f"[t1] my e-mail is {EMAIL}, card {CARD}; token {pat}, AWS_SECRET_ACCESS_KEY={aws} and my key {sk}"
    history: list[Any] = [{"role": "user", "content": said}]
    first = api.chat.completions.create(model="flowstate", messages=history, user="alice")
    assert first.choices[0].message.content == f"Noted {EMAIL}."  # the turn that received it answers with it
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "[t2] send me the confirmation"}]
    second = api.chat.completions.create(model="flowstate", messages=history, user="alice")
    assert second.choices[0].message.content == "Sent."
    assert [json.loads(line) for line in log.read_text().splitlines()] == [{"to": EMAIL, "body": "confirmed"}]

    shown = httpx.get(f"{url}/sessions/alice", timeout=30).text
    assert EMAIL not in shown and CARD not in shown and ph in shown
    assert not any(secret in shown for secret in SECRETS)
    record = httpx.get(f"{url}/sessions/alice/requests/1", timeout=30).json()
    assert record["record"]["redactions"]["email"] >= 3 and record["record"]["redactions"]["card"] >= 1
    assert record["record"]["redactions"]["secret"] >= 3 and not any(secret in json.dumps(record) for secret in SECRETS)
    assert httpx.get(f"{url}/memory/search", params={"q": "example"}, timeout=30).json()["data"] == []
    exported = httpx.get(f"{url}/sessions/alice/export", timeout=30).text
    assert EMAIL not in exported and not any(secret in exported for secret in SECRETS)
    db = Path(str(server.db))
    stored = b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())
    assert EMAIL.encode() not in stored and b"4111" not in stored
    assert not any(secret.encode() in stored for secret in SECRETS)

    server.stop()  # a restart: the session comes back from the database, redacted
    url = server.start(lines("[t3]", [output(content="You are welcome.")]), *args)
    api = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    history += [{"role": "assistant", "content": "Sent."}, {"role": "user", "content": "[t3] thanks"}]
    third = api.chat.completions.create(model="flowstate", messages=history, user="alice")  # real values resent
    assert third.choices[0].message.content == "You are welcome."
    session = httpx.get(f"{url}/sessions/alice", timeout=30).json()
    assert len(session["requests"]) == 3 and session["forked_from"] is None  # it continued; no fork, no new session
    assert [s["id"] for s in httpx.get(f"{url}/sessions", timeout=30).json()["data"]] == ["alice"]


def test_redaction_without_a_vault_key_refuses_to_start(server: Server) -> None:
    try:
        server.start([{"text": output(content="hi")}], "--redact", "mask", env={"FLOWSTATE_VAULT_KEY": ""})
    except RuntimeError as exc:
        assert "redaction needs a vault key" in str(exc)
    else:
        raise AssertionError("a server that redacts without a vault key started")


def test_the_access_log_names_each_route_without_its_query_string(server: Server) -> None:
    """A search's words (an e-mail address here) are data: the access log keeps the route and the status, never the
    query string, which no redaction or erasure would reach there."""
    url = server.start(None, "--log-level", "info")
    found = httpx.get(f"{url}/memory/search", params={"q": "alice.smith+billing@example.com"}, timeout=30)
    assert found.status_code == 200
    assert httpx.get(f"{url}/sessions", params={"limit": 7}, timeout=30).status_code == 200
    server.stop()
    log = server.log.read_text()
    assert "GET /v1/memory/search?… HTTP/1.1\" 200" in log and "GET /v1/sessions?… HTTP/1.1\" 200" in log
    assert "alice" not in log and "billing" not in log and "limit" not in log
