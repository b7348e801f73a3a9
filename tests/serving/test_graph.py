"""The state graph's one layout (serving/graph.py): a column a request, nodes in their order, arrows only between
placed nodes (one within a column bows out), and the graph page drawn exactly where the layout says."""

from __future__ import annotations

import re
from typing import Any

from serving.graph import COL_GAP, COL_W, LEFT, NODE_H, ROW_GAP, TOP, layout, render_html


def node(node_id: str, request: int, *relations: tuple[str, str], kind: str = "state") -> dict[str, Any]:
    return {"id": node_id, "kind": kind, "type": "knowledge", "summary": f"<{node_id}>", "value": {},
            "request": request,
            "relations": [{"rel": rel, "target": target} for rel, target in relations]}


DUMP = {"requests": [{"index": 1, "query": "first"}, {"index": 2, "query": "second <b>"}],
        "nodes": [node("a", 1), node("b", 1, ("supports", "a")), node("obs", 1, kind="observation"),
                  node("c", 2, ("derives", "a"), ("follows", "gone")), node("stray", 9, ("supports", "a"))]}


def test_a_column_a_request_and_nodes_in_their_order() -> None:
    placed = layout(DUMP)
    assert [c["index"] for c in placed["columns"]] == [1, 2]
    assert {n["id"]: (n["x"], n["y"]) for n in placed["nodes"]} == {
        "a": (LEFT, TOP), "b": (LEFT, TOP + NODE_H + ROW_GAP), "obs": (LEFT, TOP + 2 * (NODE_H + ROW_GAP)),
        "c": (LEFT + COL_W + COL_GAP, TOP)}  # a node of no listed request is not placed
    assert placed["height"] == TOP + 3 * NODE_H + 2 * ROW_GAP + 24
    assert placed["width"] == 2 * LEFT + 2 * (COL_W + COL_GAP)


def test_arrows_join_placed_nodes_only_and_bow_out_within_a_column() -> None:
    edges = {(e["source"], e["target"]): e for e in layout(DUMP)["edges"]}
    assert set(edges) == {("b", "a"), ("c", "a")}  # to a node never stored, from one not placed: none
    within, across = edges[("b", "a")]["path"], edges[("c", "a")]["path"]
    sy, ey = TOP + NODE_H + ROW_GAP + NODE_H / 2, TOP + NODE_H / 2
    assert within == f"M {LEFT + COL_W} {sy} C {LEFT + COL_W + 40} {sy}, {LEFT + COL_W + 40} {ey}, {LEFT + COL_W} {ey}"
    assert across.startswith(f"M {LEFT + COL_W + COL_GAP} {ey}") and across.endswith(f"{LEFT + COL_W} {ey}")


def test_the_page_draws_the_layout_and_escapes_what_it_shows() -> None:
    placed, page = layout(DUMP), render_html(DUMP, "t<1>")
    rects = re.findall(r'data-id="([^"]+)"[^>]*><title>[^<]*</title><rect x="([^"]+)" y="([^"]+)"', page)
    assert {i: (float(x), float(y)) for i, x, y in rects} == {n["id"]: (n["x"], n["y"]) for n in placed["nodes"]}
    assert re.findall(r'<path class="edge" d="([^"]+)"', page) == [e["path"] for e in placed["edges"]]
    assert "<b>" not in page and "&lt;b&gt;" in page and "t&lt;1&gt;" in page and "<c>" not in page
