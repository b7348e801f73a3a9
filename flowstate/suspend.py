"""A request that waits on its client's tool results, as JSON and back, so that it outlives the process.

The snapshot holds what ``RequestRun`` built so far — the Active State, the steps, the feedback and
latest observation, the pending calls — and what it was started with (query, system prompt, tool
specs, request options, strategy). What the session's history gives (the index, the historical ids)
is read again from the repository on restore: nothing of the session can change while the request
waits, since its turns are serialized and the request is not yet persisted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.base import Engine, Sampling
from flowstate.active import Disclosed
from flowstate.constrain import Grammars
from flowstate.loop import LoopConfig, RequestRun
from flowstate.nodes import Node
from flowstate.protocol import ToolCall
from flowstate.records import StepRecord
from flowstate.repository import Repository
from flowstate.request_options import RequestOptions
from flowstate.strategies import get

VERSION = 1


def _node(n: Node) -> dict[str, Any]:
    return n.model_dump(mode="json")


def snapshot(run: RequestRun) -> dict[str, Any]:
    if run.done:
        raise ValueError("a finished request needs no snapshot")
    state = run.state
    return {
        "version": VERSION, "session": run.session, "query": run.query, "system": run.system,
        "tool_specs": list(run.tool_specs), "strategy": run.strategy.name, "request": run.index_k,
        "options": dataclasses.asdict(run.options),
        "state": {"current": [_node(n) for n in state.current], "observations": [_node(n) for n in state.observations],
                  "disclosed": [{"node": _node(d.node), "incoming": [list(i) for i in d.incoming]}
                                for d in state.disclosed],
                  "order": list(state.order)},
        "steps": [s.to_dict() for s in run.steps], "feedback": list(run.feedback),
        "observation": [_node(n) for n in run.observation], "pending": [c.model_dump(mode="json") for c in run.pending],
        "errors": run.consecutive_errors, "memory_calls": [s.to_dict() for s in run.memory_calls],
        "memory_state": run.memory_state,
    }


def options_from(d: dict[str, Any]) -> RequestOptions:
    return RequestOptions(sampling=Sampling(**d["sampling"]), max_tokens=d["max_tokens"], stop=tuple(d["stop"]),
                          tool_choice=d["tool_choice"], parallel_tool_calls=d["parallel_tool_calls"],
                          answer_schema=d["answer_schema"])


def restore(snap: dict[str, Any], *, engine: Engine, repo: Repository, config: LoopConfig,
            grammars: Grammars | None) -> RequestRun:
    """The request as it was when ``snapshot`` was taken, on this process's engine and repository."""
    if snap.get("version") != VERSION:
        raise ValueError(f"a suspended request of snapshot version {snap.get('version')!r}; this FlowState reads {VERSION}")
    run = RequestRun(engine=engine, repo=repo, session=snap["session"], query=snap["query"], system=snap["system"],
                     tool_specs=snap["tool_specs"], config=config, grammars=grammars, strategy=get(snap["strategy"]),
                     options=options_from(snap["options"]))
    if run.index_k != snap["request"]:
        raise ValueError(f"session {snap['session']!r} moved on: the suspended request {snap['request']} is now "
                         f"request {run.index_k}")
    s = snap["state"]
    run.state = dataclasses.replace(
        run.state,
        current=tuple(Node.model_validate(n) for n in s["current"]),
        observations=tuple(Node.model_validate(n) for n in s["observations"]),
        disclosed=tuple(Disclosed(Node.model_validate(d["node"]), tuple((a, b) for a, b in d["incoming"]))
                        for d in s["disclosed"]),
        order=tuple(s["order"]),
    )
    run.steps = [StepRecord.from_dict(d) for d in snap["steps"]]
    run.feedback = list(snap["feedback"])
    run.observation = tuple(Node.model_validate(n) for n in snap["observation"])
    run.pending = tuple(ToolCall.model_validate(c) for c in snap["pending"])
    run.consecutive_errors = snap["errors"]
    run.memory_calls = [StepRecord.from_dict(d) for d in snap.get("memory_calls", [])]
    run.memory_state = dict(snap.get("memory_state", {}))
    return run
