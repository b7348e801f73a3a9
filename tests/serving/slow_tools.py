"""A server-side tool that takes its time, so that a test's concurrent calls arrive while a turn runs."""

from __future__ import annotations

import time

from flowstate.tools import Tool, ToolSet


def wait(seconds: float) -> str:
    """Wait this many seconds."""
    time.sleep(min(seconds, 10.0))
    return "waited"


TOOLS = ToolSet([Tool.from_function(wait)])
