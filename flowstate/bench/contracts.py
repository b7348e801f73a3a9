"""``flowstate bench contracts``: do replies keep what requests promise, on a real model at a tight step budget?

Three kinds of request each promise more than text: a JSON answer (``response_format`` json_schema), a
named tool call (``tool_choice`` naming it) and some tool call (``tool_choice: "required"``). Each is sent
``tries`` times, each in a fresh session, through the endpoint in process (the official ``openai`` client);
every reply is classified as kept (the promise holds), error (the endpoint said it could not keep it) or
broken (a 200 whose reply breaks the promise — what must never happen).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from engine.base import Engine
from flowstate.bench.table import table
from flowstate.config import LoopConfig

TOOL: Any = {"type": "function", "function": {
    "name": "get_price", "description": "Price per night of a hotel.",
    "parameters": {"type": "object", "properties": {"hotel": {"type": "string"}}, "required": ["hotel"]}}}
SCHEMA = {"type": "object", "properties": {"hotel": {"type": "string"}, "nights": {"type": "integer"}},
          "required": ["hotel", "nights"], "additionalProperties": False}
KINDS: dict[str, dict[str, Any]] = {
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "booking", "schema": SCHEMA}}},
    "tool_choice named": {"tool_choice": {"type": "function", "function": {"name": "get_price"}}},
    "tool_choice required": {"tool_choice": "required"},
}
QUERY = "I want hotel Aurora for 3 nights. What does it cost per night?"
HEAD = ["request", "tries", "kept", "error", "broken", "steps (mean)"]


def verdict(kind: str, message: Any) -> bool:
    """Whether a 200's reply keeps the kind's promise."""
    if kind == "json_schema":
        try:
            value = json.loads(message.content or "")
        except ValueError:
            return False
        return isinstance(value, dict) and set(value) == {"hotel", "nights"} and isinstance(value["hotel"], str) \
            and isinstance(value["nights"], int) and not isinstance(value["nights"], bool)
    calls = message.tool_calls or []
    return bool(calls) and all(c.function.name == "get_price" for c in calls)


def bench_contracts(engine: Engine, tries: int, loop: LoopConfig,
                    progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    import openai
    from fastapi.testclient import TestClient

    from flowstate.store.repository import Repository
    from serving.app import create_app
    from serving.services import ServerConfig

    rows = []
    with Repository.open(":memory:") as repo, TestClient(create_app(ServerConfig(engine=engine, repo=repo, loop=loop)),
                                                          base_url="http://flowstate.test") as http:
        api = openai.OpenAI(base_url="http://flowstate.test/v1", api_key="none", http_client=http, max_retries=0)
        for kind, options in KINDS.items():
            counts = {"kept": 0, "error": 0, "broken": 0}
            steps = 0
            for i in range(tries):
                try:
                    r = api.chat.completions.create(model="flowstate", user=f"{kind.split()[-1]}-{i}", tools=[TOOL],
                                                    messages=[{"role": "user", "content": QUERY}], **options)
                except openai.APIStatusError as exc:
                    counts["error"] += 1
                    progress(f"{kind} {i + 1}/{tries}: error {exc.status_code}")
                    continue
                steps += r.model_extra["flowstate"]["model_calls"] if r.model_extra else 0
                outcome = "kept" if verdict(kind, r.choices[0].message) else "broken"
                counts[outcome] += 1
                progress(f"{kind} {i + 1}/{tries}: {outcome}")
            answered = counts["kept"] + counts["broken"]
            rows.append({"request": kind, "tries": tries, **counts,
                         "steps (mean)": f"{steps / answered:.1f}" if answered else "–"})
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
