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
from flowstate.config import AgentConfig, Wiring
from flowstate.loop import Progress, RequestRun, Waiting
from flowstate.nodes import Node
from flowstate.protocol import ToolCall
from flowstate.records import StepRecord
from flowstate.request_options import RequestOptions
from flowstate.store.repository import Repository
from grammars.check import GrammarError

VERSION = 2  # 2: the waiting client calls and the client's tool names are the run's (1: the server's)


def _node(n: Node) -> dict[str, Any]:
    return n.model_dump(mode="json")


def snapshot(run: RequestRun) -> dict[str, Any]:
    if run.done:
        raise ValueError("a finished request needs no snapshot")
    p = run.progress
    state = p.state
    return {
        "version": VERSION, "session": run.session, "query": run.query, "system": run.system,
        "policy": run.wiring.policy, "tool_specs": run.tool_specs, "client_tools": sorted(run.client_tools),
        "strategy": run.strategy.name,
        "request": run.index_k, "options": dataclasses.asdict(run.options),
        "state": {"current": [_node(n) for n in state.current], "observations": [_node(n) for n in state.observations],
                  "disclosed": [{"node": _node(d.node), "incoming": [list(i) for i in d.incoming]}
                                for d in state.disclosed],
                  "order": list(state.order)},
        "steps": [s.to_dict() for s in p.steps], "feedback": list(p.feedback),
        "observation": [_node(n) for n in p.observation], "pending": [c.model_dump(mode="json") for c in p.pending],
        "waiting": None if p.waiting is None else p.waiting.to_dict(),
        "errors": p.errors, "memory_calls": [s.to_dict() for s in p.memory_calls], "memory_state": p.scratch,
    }


def options_from(d: dict[str, Any]) -> RequestOptions:
    return RequestOptions(sampling=Sampling(**d["sampling"]), max_tokens=d["max_tokens"],
                          answer_tokens=d.get("answer_tokens"), stop=tuple(d["stop"]),
                          tool_choice=d["tool_choice"], parallel_tool_calls=d["parallel_tool_calls"],
                          answer_schema=d["answer_schema"], hidden=tuple(d.get("hidden", ())),
                          approval=tuple(d.get("approval", ())), lane=d.get("lane"))


def restore(snap: dict[str, Any], *, engine: Engine, repo: Repository, agent: AgentConfig) -> RequestRun:
    """The request as it was when ``snapshot`` was taken, on this process's engine, repository and agent
    configuration (whose strategy must be the one the request started under)."""
    if snap.get("version") != VERSION:
        raise ValueError(f"a suspended request of snapshot version {snap.get('version')!r}; this FlowState reads "
                         f"{VERSION}: resend the request's user message")
    if snap["strategy"] != agent.strategy.name:
        raise ValueError(f"the suspended request runs strategy {snap['strategy']!r}, this server "
                         f"{agent.strategy.name!r}")
    options = options_from(snap["options"])
    specs = snap["tool_specs"]
    try:  # the snapshot's tool schemas compile, as a new request's must (the one check, in the agent's cache)
        grammars = agent.grammars(specs, options, validate=True)
    except GrammarError as exc:
        raise ValueError(f"the suspended request's tools cannot be decoded under a grammar: {exc}") from exc
    wiring = Wiring(snap["system"], tuple(specs), grammars, str(snap.get("policy") or ""))
    client = [t for t in specs if t["name"] in set(snap["client_tools"])]
    run = RequestRun(engine=engine, repo=repo, session=snap["session"], query=snap["query"], agent=agent,
                     options=options, client_tools=client, wiring=wiring)
    if run.index_k != snap["request"]:
        raise ValueError(f"session {snap['session']!r} moved on: the suspended request {snap['request']} is now "
                         f"request {run.index_k}")
    s = snap["state"]
    state = dataclasses.replace(
        run.state,
        current=tuple(Node.model_validate(n) for n in s["current"]),
        observations=tuple(Node.model_validate(n) for n in s["observations"]),
        disclosed=tuple(Disclosed(Node.model_validate(d["node"]), tuple((a, b) for a, b in d["incoming"]))
                        for d in s["disclosed"]),
        order=tuple(s["order"]),
    )
    run.progress = Progress(
        state=state, steps=[StepRecord.from_dict(d) for d in snap["steps"]], feedback=list(snap["feedback"]),
        observation=tuple(Node.model_validate(n) for n in snap["observation"]),
        pending=tuple(ToolCall.model_validate(c) for c in snap["pending"]),
        waiting=None if snap["waiting"] is None else Waiting.from_dict(snap["waiting"]),
        errors=snap["errors"], memory_calls=[StepRecord.from_dict(d) for d in snap["memory_calls"]],
        scratch=dict(snap["memory_state"]),
    )
    return run
