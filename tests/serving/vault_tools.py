"""A server-side tool that writes down the arguments it got (to ``$FLOWSTATE_TEST_TOOL_LOG``), so that a test sees
what a tool receives where the model wrote a redacted value's placeholder."""

from __future__ import annotations

import json
import os

from flowstate.tools import Tool, ToolSet


def send_email(to: str, body: str) -> str:
    """Send an e-mail."""
    with open(os.environ["FLOWSTATE_TEST_TOOL_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"to": to, "body": body}) + "\n")
    return f"sent to {to}"


TOOLS = ToolSet([Tool.from_function(send_email)])
