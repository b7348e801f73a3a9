"""A session's memory as data and as a terminal drawing of its state graph."""

from __future__ import annotations

from typing import Any

from flowstate.errors import SessionNotFound
from flowstate.history import build_index
from flowstate.store.repository import Repository

_MARK = {"preference": "P", "knowledge": "K", "attribute": "A", "judgement": "J", "artifact": "R"}


def session_dump(repo: Repository, session: str) -> dict[str, Any]:
    """Requests, the Historical State Index and every node with its relations, the session it was forked from and
    those forked from it (raises if unknown)."""
    if not repo.has_session(session):
        raise SessionNotFound(f"unknown session {session!r} in {repo.path}")
    requests = repo.requests(session)
    nodes = repo.nodes(session)
    index = build_index(requests, nodes)
    fork = repo.lineage.forked_from(session)
    return {
        "session": session,
        "forked_from": None if fork is None else {"session": fork[0], "requests": fork[1]},
        "forks": [{"session": name, "requests": at} for name, at in repo.lineage.forks(session)],
        "requests": [{"index": r.index, "query": r.query, "response": r.response, "unfinished": r.unfinished,
                      "created_at": r.created_at, "strategy": r.strategy} for r in requests],
        "index": [
            {"query_id": e.query_id, "user_query": e.user_query,
             "states": [{"state_id": s, "summary": m} for s, m in e.states]}
            for e in index.entries
        ],
        "nodes": [
            {
                "id": n.id, "kind": n.kind, "type": n.type.value, "summary": n.summary, "value": n.value,
                "request": n.request, "relations": [{"rel": r.rel.value, "target": r.state_id} for r in n.refs],
            }
            for n in nodes
        ],
    }


def render_graph(dump: dict[str, Any]) -> str:
    """The state graph grouped by request: each node with its type and outgoing relations."""
    lines = [f"session {dump['session']}: {len(dump['requests'])} requests, {len(dump['nodes'])} nodes"]
    for req in dump["requests"]:
        lines.append(f"\nrequest {req['index']}: {req['query']}")
        if req["response"] is not None:
            lines.append(f"  response: {req['response']}")
        elif req.get("unfinished"):
            lines.append(f"  unfinished: {req['unfinished']}")
        for node in (n for n in dump["nodes"] if n["request"] == req["index"]):
            kind = "observation" if node["kind"] == "observation" else node["type"]
            lines.append(f"  [{_MARK.get(node['type'], '?') if kind != 'observation' else 'O'}] {node['id']} ({kind}): "
                         f"{node['summary']}")
            for rel in node["relations"]:
                lines.append(f"        --{rel['rel']}--> {rel['target']}")
    return "\n".join(lines)
