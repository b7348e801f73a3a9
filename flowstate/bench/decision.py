"""``flowstate bench decision``: where a model decides to act or to answer, read from its next-token probabilities.

The prompt is the hotel case's first step (request 1, nothing known yet) under FlowState's system prompt, with and
without the protocol's worked example and final-answer rule (``serializer.example_steps``, ``ANSWER_RULE``). At each
block the per-step grammar reaches, the model's probability mass on a non-empty list (``[`` then an item) and on
an empty one (``[]``) is read from llama.cpp's logits (no grammar mask: what the model itself prefers there):

- ``state_focus`` — unconstrained, before the grammar forces ``[]`` (a first request has nothing to disclose);
- ``state_delta`` after that forced ``[]``;
- ``tool_calls`` after ``[]`` in both state blocks — the decision the answer branch wins when it is empty.
"""

from __future__ import annotations

from typing import Any

from engine.base import Message
from engine.text import common_prefix

PREFIXES = {
    "state_focus": "<state_focus>\n",
    "state_delta | focus []": "<state_focus>\n[]\n</state_focus>\n<state_delta>\n",
    "tool_calls | [] []": "<state_focus>\n[]\n</state_focus>\n<state_delta>\n[]\n</state_delta>\n<tool_calls>\n",
}


def _mass(engine: Any, text: str, top: int = 64) -> tuple[float, float]:
    """(P(non-empty list), P(empty list)) of the next token after ``text``, over the ``top`` likeliest tokens."""
    import numpy as np

    llm = engine.llm
    tokens = engine.tokenize(text)
    keep = min(common_prefix(llm.input_ids[: llm.n_tokens].tolist(), tokens), len(tokens) - 1)
    llm.n_tokens = keep  # llama.cpp reuses the cached prefix; only the rest is evaluated
    llm.eval(tokens[keep:])
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    some = empty = 0.0
    for token in np.argsort(-p)[:top]:
        piece = llm.detokenize([int(token)]).decode("utf-8", errors="replace").lstrip()
        if piece.startswith("[]"):
            empty += float(p[token])
        elif piece.startswith("["):
            some += float(p[token])
    return some, empty


def variants(system: str) -> dict[str, str]:
    """The system prompt as shipped and without the worked example and the final-answer rule (the prompt before)."""
    from flowstate.serializer import ANSWER_RULE, example_steps

    before = system.replace("\n" + example_steps(), "").replace(" " + ANSWER_RULE, "")
    return {"shipped": system, "without example and answer rule": before}


def bench_decision(engine: Any) -> list[dict[str, Any]]:
    """Per prompt variant and decision point: the model's mass on a non-empty and on an empty list."""
    from flowstate import tags
    from flowstate.active import ActiveState
    from flowstate.demo import hotel
    from flowstate.limits import STANDARD
    from flowstate.memory.state import FLOWSTATE
    from flowstate.serializer import layout

    system = FLOWSTATE.system_prompt(hotel.TOOLS.specs(), hotel.POLICY, STANDARD)
    user = layout(hotel.QUERIES[0], memory=(tags.HISTORICAL_INDEX, ""), state=ActiveState(request=1))
    rows = []
    for name, text in variants(system).items():
        prompt = engine.render([Message("system", text), Message("user", user)])
        for point, prefix in PREFIXES.items():
            some, empty = _mass(engine, prompt + prefix)
            rows.append({"prompt": name, "block": point, "P(non-empty)": f"{some:.3f}", "P([])": f"{empty:.3f}"})
    return rows
