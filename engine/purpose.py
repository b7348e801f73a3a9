"""What a model call is for, as its caller declares it: an agent step, or a memory method's own call by kind."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Purpose:
    """What a model call is for: an agent step (``STEP``), or a memory method's own call — its kind
    (``"mem0.extract"``, ``"mage.compress"``, …) and the model its reply parses into (None: free text). Backends
    decode the same either way; an engine that answers by rule (a reference policy, a replay) dispatches on it,
    never on the prompt's words."""

    kind: str
    reply: type | None = None


STEP = Purpose("step")
