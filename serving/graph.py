"""The human view of a session's memory: an HTML page with the state graph drawn as SVG.

Nodes are coloured by state type (raw observations grey), grouped in one column per request, and
relations are labelled arrows. Drawn on the server, so the page needs no script or network.
"""

from __future__ import annotations

import re
from html import escape
from importlib import resources
from typing import Any

_PALETTE = (resources.files("serving.console") / "console.css").read_text(encoding="utf-8")
COLOURS = {m[1]: m[2] for m in re.finditer(r"--t-(\w+):\s*(#[0-9a-fA-F]{6})", _PALETTE)}
"""Each state type's colour, as the console's stylesheet writes it (the one place the palette is written)."""
RELATION_COLOURS = {m[1]: m[2] for m in re.finditer(r"--r-(\w+):\s*(#[0-9a-fA-F]{6})", _PALETTE)}
COL_W, COL_GAP, NODE_H, ROW_GAP, TOP = 240, 90, 46, 24, 70


def _layout(dump: dict[str, Any]) -> dict[str, tuple[float, float]]:
    at: dict[str, tuple[float, float]] = {}
    for col, req in enumerate(dump["requests"]):
        nodes = [n for n in dump["nodes"] if n["request"] == req["index"]]
        for row, node in enumerate(nodes):
            at[node["id"]] = (20 + col * (COL_W + COL_GAP), TOP + row * (NODE_H + ROW_GAP))
    return at


def render_html(dump: dict[str, Any], title: str) -> str:
    """The page for ``session_dump``'s data; ``title`` is the session name as the caller knows it."""
    at = _layout(dump)
    width = 40 + max(1, len(dump["requests"])) * (COL_W + COL_GAP)
    height = TOP + 40 + max((y for _, y in at.values()), default=0) + NODE_H
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
    ]
    for col, req in enumerate(dump["requests"]):
        cx = 20 + col * (COL_W + COL_GAP)
        query = req["query"] if len(req["query"]) <= 38 else req["query"][:37] + "…"
        parts.append(f'<text x="{cx}" y="30" font-weight="bold">request {req["index"]}</text>')
        parts.append(f'<text x="{cx}" y="48"><title>{escape(req["query"])}</title>{escape(query)}</text>')
    for node in dump["nodes"]:
        for rel in node["relations"]:
            if node["id"] not in at or rel["target"] not in at:
                continue
            (x1, y1), (x2, y2) = at[node["id"]], at[rel["target"]]
            sx, ex = (x1, x2 + COL_W) if x2 < x1 else (x1 + COL_W, x2) if x2 > x1 else (x1 + COL_W, x2 + COL_W)
            sy, ey = y1 + NODE_H / 2, y2 + NODE_H / 2
            bend = 40.0 if x1 == x2 else 0.0
            path = f"M {sx} {sy} C {sx + bend} {sy}, {ex + bend} {ey}, {ex} {ey}"
            colour = RELATION_COLOURS.get(rel["rel"], "#555")
            parts.append(f'<path class="edge" d="{path}" fill="none" stroke="{colour}" marker-end="url(#arrow)"/>')
            parts.append(f'<text x="{(sx + ex) / 2 + bend}" y="{(sy + ey) / 2 - 4}" fill="{colour}">'
                         f'{escape(rel["rel"])}</text>')
    for node in dump["nodes"]:
        if node["id"] not in at:
            continue
        x, y = at[node["id"]]
        kind = "observation" if node["kind"] == "observation" else node["type"]
        summary = node["summary"] if len(node["summary"]) <= 36 else node["summary"][:35] + "…"
        tip = escape(f"{node['id']} ({kind})\n{node['summary']}\n{node['value']}")
        parts.append(
            f'<g class="node" data-id="{escape(node["id"])}" data-type="{kind}"><title>{tip}</title>'
            f'<rect x="{x}" y="{y}" width="{COL_W}" height="{NODE_H}" rx="6" fill="{COLOURS.get(kind, "#ddd")}"/>'
            f'<text x="{x + 8}" y="{y + 18}" font-weight="bold">{escape(node["id"])}</text>'
            f'<text x="{x + 8}" y="{y + 36}">{escape(summary)}</text></g>'
        )
    parts.append("</svg>")
    legend = " ".join(
        f'<span style="background:{c};padding:2px 8px;border-radius:4px">{t}</span>' for t, c in COLOURS.items()
    )
    return (
        f"<!doctype html><html><head><meta charset=\"utf-8\"><title>FlowState session {escape(title)}</title></head>"
        f"<body style=\"font-family:sans-serif\"><h1>Session {escape(title)}</h1>"
        f"<p>{len(dump['requests'])} requests, {len(dump['nodes'])} nodes. {legend}</p>"
        + "".join(parts) + "</body></html>"
    )
