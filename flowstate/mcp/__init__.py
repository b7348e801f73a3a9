"""Tools from MCP servers (the Model Context Protocol, through the official ``mcp`` SDK): ``--mcp NAME=COMMAND``
(stdio) or ``--mcp NAME=URL`` (streamable HTTP) on ``run``, ``serve`` and ``eval``; ``connect()`` in Python.

A source's tools are listed when it starts and join the configuration's tools: the system prompt and the
grammar see them as they see Python tools (their input schemas, objects closed). See docs/mcp.md.
"""

from flowstate.mcp.connection import Server
from flowstate.mcp.source import CALL_TIMEOUT_S, MAX_SESSIONS, SCOPES, McpSource, connect

__all__ = ["CALL_TIMEOUT_S", "MAX_SESSIONS", "SCOPES", "McpSource", "Server", "connect"]
