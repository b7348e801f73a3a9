"""The state graph's one layout, and the human page drawn from it: an HTML page with the graph as SVG.

Nodes are grouped in one column per request, in their order, and relations are arrows between them. ``layout``
places everything once; the page here draws it on the server (no script, no network) and the console draws the
same layout, which the session route returns with ``?layout=true``. Colours come from the console's stylesheet.
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
COL_W, COL_GAP, NODE_H, ROW_GAP, TOP, LEFT = 210, 80, 40, 18, 56, 16
BEND = 40  # how far an arrow between two nodes of one column bows out to the right


LABEL_H, CHAR_W = 12, 6.5  # a relation label's box: its height, and its width a character (11 px text)
SPOTS = (0.5, 0.35, 0.65, 0.2, 0.8, 0.1, 0.9)  # where along its arrow a label may go, the middle first
_CELL = 60  # the grid that finds the labels already placed near a spot


def _point(t: float, p0: tuple[float, float], p1: tuple[float, float], p2: tuple[float, float],
           p3: tuple[float, float]) -> tuple[float, float]:
    """The cubic Bézier's point at ``t``."""
    a, b, c, d = (1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t * t, t ** 3
    return (round(a * p0[0] + b * p1[0] + c * p2[0] + d * p3[0], 1),
            round(a * p0[1] + b * p1[1] + c * p2[1] + d * p3[1], 1))


class _Labels:
    """Relation labels placed on their arrows, each at the first spot along it that no label placed before covers
    (else the spot least covered): labels between two columns spread along their arrows instead of stacking."""

    def __init__(self) -> None:
        self._grid: dict[tuple[int, int], list[tuple[float, float, float]]] = {}

    def _overlap(self, x: float, y: float, w: float) -> float:
        area = 0.0
        for gx in range(int(x // _CELL) - 2, int((x + w) // _CELL) + 2):
            for gy in range(int(y // _CELL) - 1, int(y // _CELL) + 2):
                for ox, oy, ow in self._grid.get((gx, gy), ()):
                    dx = min(x + w, ox + ow) - max(x, ox)
                    dy = min(y, oy) - max(y - LABEL_H, oy - LABEL_H)
                    if dx > 0 and dy > 0:
                        area += dx * dy
        return area

    def place(self, text: str, curve: tuple[tuple[float, float], ...]) -> tuple[float, float]:
        """Where ``text``'s label goes on the arrow ``curve`` (its start, two controls, its end): the label's
        left end at the text's baseline, centred on the point."""
        w = len(text) * CHAR_W
        best: tuple[float, float, float] | None = None
        for t in SPOTS:
            px, py = _point(t, *curve)
            x, y = round(px - w / 2, 1), round(py + LABEL_H / 2 - 2, 1)
            covered = self._overlap(x, y, w)
            if best is None or covered < best[0]:
                best = (covered, x, y)
            if covered == 0:
                break
        assert best is not None
        _, x, y = best
        self._grid.setdefault((int(x // _CELL), int(y // _CELL)), []).append((x, y, w))
        return x, y


def layout(dump: dict[str, Any]) -> dict[str, Any]:
    """Where each part of the graph of ``session_dump``'s data goes, in pixels: ``columns`` (one a request: its
    ``x``), ``nodes`` (each id's ``x``, ``y``; a node of no listed request is left out), ``edges`` (an arrow's
    ``path`` and its label's ``label_x``/``label_y``, for relations between placed nodes), the node size and the
    whole drawing's ``width`` and ``height``."""
    columns, at = [], {}
    by_request: dict[int, list[str]] = {}
    for n in dump["nodes"]:  # one pass: a session of thousands of requests and nodes is laid out in linear time
        by_request.setdefault(n["request"], []).append(n["id"])
    for col, req in enumerate(dump["requests"]):
        x = LEFT + col * (COL_W + COL_GAP)
        columns.append({"index": req["index"], "x": x})
        for row, node_id in enumerate(by_request.get(req["index"], [])):
            at[node_id] = (x, TOP + row * (NODE_H + ROW_GAP))
    edges, labels = [], _Labels()
    for node in dump["nodes"]:
        for rel in node["relations"]:
            if node["id"] not in at or rel["target"] not in at:
                continue
            (x1, y1), (x2, y2) = at[node["id"]], at[rel["target"]]
            sx, ex = (x1, x2 + COL_W) if x2 < x1 else (x1 + COL_W, x2) if x2 > x1 else (x1 + COL_W, x2 + COL_W)
            sy, ey = y1 + NODE_H / 2, y2 + NODE_H / 2
            bend = BEND if x1 == x2 else 0
            lx, ly = labels.place(rel["rel"], ((sx, sy), (sx + bend, sy), (ex + bend, ey), (ex, ey)))
            edges.append({"source": node["id"], "target": rel["target"], "rel": rel["rel"],
                          "path": f"M {sx} {sy} C {sx + bend} {sy}, {ex + bend} {ey}, {ex} {ey}",
                          "label_x": lx, "label_y": ly})
    bottom = max((y + NODE_H for _, y in at.values()), default=TOP)
    return {"width": 2 * LEFT + max(1, len(columns)) * (COL_W + COL_GAP), "height": bottom + 24,
            "node_width": COL_W, "node_height": NODE_H, "columns": columns,
            "nodes": [{"id": i, "x": x, "y": y} for i, (x, y) in at.items()], "edges": edges}


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def render_html(dump: dict[str, Any], title: str) -> str:
    """The page for ``session_dump``'s data; ``title`` is the session name as the caller knows it."""
    placed = layout(dump)
    nodes = {n["id"]: n for n in dump["nodes"]}
    queries = {r["index"]: r["query"] for r in dump["requests"]}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{placed["width"]}" height="{placed["height"]}" '
        'font-family="sans-serif" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
    ]
    for col in placed["columns"]:
        query = queries[col["index"]]
        parts.append(f'<text x="{col["x"]}" y="22" font-weight="bold">request {col["index"]}</text>')
        parts.append(f'<text x="{col["x"]}" y="40"><title>{escape(query)}</title>{escape(_clip(query, 34))}</text>')
    for edge in placed["edges"]:
        colour = RELATION_COLOURS.get(edge["rel"], "#555")
        parts.append(f'<path class="edge" d="{edge["path"]}" fill="none" stroke="{colour}" '
                     'marker-end="url(#arrow)"/>')
        parts.append(f'<text x="{edge["label_x"]}" y="{edge["label_y"]}" fill="{colour}">{escape(edge["rel"])}</text>')
    w, h = placed["node_width"], placed["node_height"]
    for spot in placed["nodes"]:
        node, x, y = nodes[spot["id"]], spot["x"], spot["y"]
        kind = "observation" if node["kind"] == "observation" else node["type"]
        tip = escape(f"{node['id']} ({kind})\n{node['summary']}\n{node['value']}")
        parts.append(
            f'<g class="node" data-id="{escape(node["id"])}" data-type="{kind}"><title>{tip}</title>'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{COLOURS.get(kind, "#ddd")}"/>'
            f'<text x="{x + 8}" y="{y + 16}" font-weight="bold">{escape(_clip(node["id"], 30))}</text>'
            f'<text x="{x + 8}" y="{y + 32}">{escape(_clip(node["summary"], 32))}</text></g>'
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
