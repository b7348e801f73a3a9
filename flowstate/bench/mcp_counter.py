"""A stateful MCP server for ``flowstate bench mcp``: one tool, ``count``, that counts its own calls per process.

``python -m flowstate.bench.mcp_counter`` serves it over stdio (the official MCP SDK). A session whose server was
released gets a fresh process on its next call, so its count starts again at 1 — the state a release loses.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("flowstate-counter", log_level="WARNING")
COUNT = {"n": 0}


@server.tool()
def count() -> int:
    """How many times this server process has been called, this call included."""
    COUNT["n"] += 1
    return COUNT["n"]


if __name__ == "__main__":
    server.run()
