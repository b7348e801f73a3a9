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


def test_labels_sit_on_their_arrows_and_never_on_each_other() -> None:
    """Arrows that cross in one gutter (their middles at one point) and several from one node: each label on its
    own arrow, no two overlapping — where the middle of each arrow would have stacked them."""
    from serving.graph import CHAR_W, LABEL_H, SPOTS, _point

    crossing = {"requests": [{"index": 1, "query": "q"}, {"index": 2, "query": "r"}, {"index": 3, "query": "s"}],
                "nodes": [node("a", 1), node("b", 1), node("c", 1),
                          node("d", 2, ("derives", "b"), ("supports", "c")), node("e", 2, ("supports", "a")),
                          node("f", 2, ("follows", "a"), ("supersedes", "b")),
                          node("g", 3, ("derives", "a"), ("supports", "b"), ("follows", "d"))]}
    placed = layout(crossing)
    assert len(placed["edges"]) == 8
    boxes = []
    for edge in placed["edges"]:
        nums = [float(v) for v in re.findall(r"-?[\d.]+", edge["path"])]
        curve = ((nums[0], nums[1]), (nums[2], nums[3]), (nums[4], nums[5]), (nums[6], nums[7]))
        w = len(edge["rel"]) * CHAR_W
        centre = (edge["label_x"] + w / 2, edge["label_y"] - LABEL_H / 2 + 2)
        assert any(abs(centre[0] - px) < 0.2 and abs(centre[1] - py) < 0.2
                   for px, py in (_point(t, *curve) for t in SPOTS)), edge  # on its own arrow
        boxes.append((edge["label_x"], edge["label_y"] - LABEL_H, w))
    for i, (x, y, w) in enumerate(boxes):
        for ox, oy, ow in boxes[:i]:
            assert min(x + w, ox + ow) <= max(x, ox) or min(y, oy) + LABEL_H <= max(y, oy), (boxes[i], (ox, oy))
