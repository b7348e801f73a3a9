"""What a model call is for, as its caller declares it: an agent step, or a memory method's own call by kind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Purpose:
    """What a model call is for: an agent step (``STEP``), or a memory method's own call — its kind
    (``"mem0.extract"``, ``"mage.compress"``, …) and the model its reply parses into (None: free text). Backends
    decode the same either way; an engine that answers by rule (a reference policy, a replay) dispatches on it,
    never on the prompt's words. ``reference``: how a model that did the method's job exactly would reply, from the
    call's user message and what a reference policy knows of the request (``flowstate.memory.reference``), so that
    the reference policies answer every method's calls by kind without knowing the method."""

    kind: str
    reply: type | None = None
    reference: Callable[[str, Any], str] | None = field(default=None, compare=False)


STEP = Purpose("step")
