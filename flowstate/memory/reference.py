"""What a reference policy answers a memory method's own call from. Each method declares, on its calls' ``Purpose``,
how a model that did the method's job exactly would reply (``Purpose.reference``: a function of the call's user
message and a ``Reference``), in terms of the few things a reference policy knows of a request: the one memory it
writes of an interaction, the world a state tracker keeps, and whether the request answered. The policies
(``flowstate/eval``) implement ``Reference`` and answer by kind; they import no method."""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

_SECTION = re.compile(r"<([a-z_]+)>\n(.*?)</\1>", re.S)


class Reference(Protocol):
    """What a reference policy knows of the request a memory call is made for."""

    def remember(self, interaction: str) -> str | None:
        """The one memory it writes of an interaction (its JSON lines, as a memory call shows it), or None."""

    def world(self, query: str, before: dict[str, Any], new: list[dict[str, Any]]) -> dict[str, Any]:
        """A state tracker's world after the newest tool results (``new``, as the call shows them)."""

    def answered(self, interaction: str) -> bool:
        """Whether the request that just ended answered."""


def sections(user: str) -> dict[str, list[dict[str, Any]]]:
    """The user message's blocks as lists of JSON objects (one per line); a tag that repeats adds its items."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, body in _SECTION.findall(user):
        items = out.setdefault(name, [])
        for line in body.splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                items.append(obj)
    return out


def read_interaction(text: str) -> tuple[str, list[dict[str, Any]]]:
    """An interaction a memory call is shown (JSON lines): its user query, and its lines."""
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return next((str(i["user_query"]) for i in lines if "user_query" in i), ""), lines
