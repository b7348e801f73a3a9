"""τ³-bench's airline domain as a server's tools: ``flowstate serve --tools flowstate.demo.airline:TOOLS`` (needs τ³'s
data: the ``tau3`` extra or ``$TAU2_DATA_DIR``). The server holds one fresh copy of τ³'s airline database, which its
calls read and change; ``POLICY`` is the domain's policy, for a client to send as its system message. What the
evaluation of your own sessions was shown on (docs/results/own-sessions.md)."""

from __future__ import annotations

from flowstate.eval.tau3.airline import AirlineTools
from flowstate.eval.tau3.domain import load

_DATA = load("airline")
POLICY = _DATA.policy
TOOLS = AirlineTools(_DATA.fresh_db()).toolset()
