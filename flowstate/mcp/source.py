"""An MCP server as a tool source: its tools listed at start, each call dispatched to a live connection.

Scope ``server`` (the default): one connection serves every session. Scope ``session``: each session gets a
connection of its own, started on its first call and ended when the session is released — a stateful server
(one database per process, as τ³'s) then keeps one state per session. At most ``max_sessions`` such connections
live at once: opening one past the bound first ends the least recently used that no call and no running turn
(``busy``) holds — that session's next call starts a fresh server, so a stateful server's state for it is lost —
and where every live one is held, the call is a tool error that says so. A call that times out, or finds its
connection gone (the server exited, hung, broke the protocol), is a tool error the model is told; that
connection is closed and the next call starts a new one, so nothing waits on a dead server.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from engine.distribution import install_hint
from flowstate.errors import ToolLoadError
from flowstate.mcp.connection import Connection, ConnectionLost, Loop, Server, describe
from flowstate.mcp.content import observation
from flowstate.tools import SchemaTool, Tool, ToolError, ToolSet

SCOPES = ("server", "session")
CALL_TIMEOUT_S = 60.0
START_TIMEOUT_S = 60.0
# per-session server processes held at once: a small Python MCP server holds ~70 MB, so 64 stay under 5 GB
MAX_SESSIONS = 64


class McpSource:
    """The tools of one MCP ``server``; ``start()`` lists them, ``tools()`` gives them as ``SchemaTool``s."""

    def __init__(self, server: Server | str, scope: str = "server", timeout: float = CALL_TIMEOUT_S,
                 start_timeout: float = START_TIMEOUT_S, max_sessions: int = MAX_SESSIONS) -> None:
        if scope not in SCOPES:
            raise ValueError(f"unknown MCP scope {scope!r}; valid: {', '.join(SCOPES)}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, not {max_sessions}")
        self.server = Server.parse(server) if isinstance(server, str) else server
        self.scope, self.timeout, self.start_timeout = scope, timeout, start_timeout
        self.max_sessions = max_sessions
        self.busy: Callable[[str], bool] = lambda _: False  # a session a running turn holds (the server sets it)
        self.specs: list[dict[str, Any]] = []
        self.reads: frozenset[str] = frozenset()  # the tools the server declares read-only (readOnlyHint)
        self.restarts = 0  # connections started after the first of their key (a server that died or hung)
        self.released = 0  # per-session connections ended to keep within max_sessions
        self._live: OrderedDict[str, Connection] = OrderedDict()  # least recently used first
        self._calls: dict[str, int] = {}  # calls in flight per key
        self._opening: set[str] = set()  # keys whose connection is starting (they count against the bound)
        self._opened: set[str] = set()
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.server.name

    def start(self) -> McpSource:
        """Connect once and list the server's tools (``ToolLoadError`` with the reason where it cannot)."""
        try:
            connection, tools = self._open()
        except ToolError as exc:
            raise ToolLoadError(str(exc)) from None
        self.specs = [{"name": t.name, "description": (t.description or getattr(t, "title", None) or "").strip(),
                       "parameters": dict(t.input_schema or {"type": "object"})} for t in tools]
        self.reads = frozenset(t.name for t in tools if t.annotations is not None and t.annotations.read_only_hint)
        if self.scope == "server":
            with self._lock:
                self._live[""], self._opened = connection, {""}
        else:
            self._stop(connection)  # each session starts its own
        return self

    def tools(self) -> list[Tool]:
        return [SchemaTool(s["name"], s["description"], fn=self._dispatcher(s["name"]), schema=s["parameters"],
                           read_only=s["name"] in self.reads) for s in self.specs]

    def _dispatcher(self, tool: str) -> Any:
        return lambda arguments, session: self.call(tool, arguments, session)

    def _open(self) -> tuple[Connection, list[Any]]:
        connection = Connection(self.server)
        try:
            tools = Loop.run(connection.open(), self.start_timeout)
        except Exception as exc:  # a server that cannot start: why, in one line, with what it wrote to stderr
            if isinstance(exc, TimeoutError):
                reason = f"did not start within {self.start_timeout:g} s"
            else:
                lost = isinstance(exc, ConnectionLost) and connection.failure
                reason = f"did not start ({connection.failure if lost else describe(exc)})"
            self._stop(connection)  # the process has ended: its stderr is all there
            raise ToolError(self._why(connection, reason)) from None
        return connection, tools

    def _why(self, connection: Connection, what: str, who: str | None = None) -> str:
        """``MCP server WHO WHAT``, with the last lines the server wrote to stderr (WHO: its name and command)."""
        tail = connection.stderr

        return f"MCP server {who or self.server} {what}" + (f"; its stderr ends: {tail}" if tail else "")

    def _key(self, session: str) -> str:
        return session if self.scope == "session" else ""

    def connection(self, session: str = "") -> Connection:
        """The live connection calls of ``session`` go to, started (or restarted) where there is none."""
        key = self._key(session)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                live = self._live.get(key)
                if live is not None:
                    self._live.move_to_end(key)
            if live is not None and live.alive:
                return live
            if live is not None:
                self._stop(live)
            if self.scope == "session":
                self._make_room(key)
            try:
                connection, _ = self._open()
            finally:
                with self._lock:
                    self._opening.discard(key)
            with self._lock:
                self.restarts += key in self._opened
                self._opened.add(key)
                self._live[key] = connection
            return connection

    def _make_room(self, key: str) -> None:
        """End least recently used per-session connections until one more fits ``max_sessions``; never one a call
        or a running turn holds (``ToolError`` where every live one is held)."""
        while True:
            with self._lock:
                others = [k for k in self._live if k != key]
                if len(others) + len(self._opening - {key}) < self.max_sessions:
                    self._opening.add(key)
                    return
                idle = next((k for k in others if not self._calls.get(k) and not self.busy(k)), None)
                if idle is None:
                    raise ToolError(f"MCP server {self.name!r}: all {len(others)} per-session connections (the bound, "
                                    "--mcp-sessions) are held by running turns; call again when one ends")
                connection = self._live.pop(idle)
                self._opened.discard(idle)  # its next start is a fresh one, not a restart
                self.released += 1
            self._stop(connection, wait=False)

    def call(self, tool: str, arguments: dict[str, Any], session: str = "") -> Any:
        """A tool's observation; ``ToolError`` for its error, a timeout or a lost connection (then closed)."""
        key = self._key(session)
        with self._lock:
            self._calls[key] = self._calls.get(key, 0) + 1
        try:
            return self._call(tool, arguments, session)
        finally:
            with self._lock:
                self._calls[key] -= 1
                if not self._calls[key]:
                    del self._calls[key]

    def _call(self, tool: str, arguments: dict[str, Any], session: str) -> Any:
        connection = self.connection(session)
        started = time.monotonic()
        try:
            result = Loop.run(connection.call(tool, arguments), self.timeout)
        except TimeoutError:
            self._drop(session, connection)
            raise ToolError(f"MCP server {self.name!r} did not answer {tool} within {self.timeout:g} s; it is "
                            "restarted on the next call") from None
        except ConnectionLost as exc:
            self._drop(session, connection)
            raise ToolError(self._why(connection, f"ended during {tool} ({exc}); it is restarted on the next call",
                                      repr(self.name))) from None
        except Exception as exc:  # the SDK's error (an MCPError, a result it cannot read)
            if not connection.alive:
                self._drop(session, connection)
            raise ToolError(f"MCP server {self.name!r} failed {tool} after {time.monotonic() - started:.1f} s: "
                            f"{describe(exc)}") from None
        return observation(result)

    def _drop(self, session: str, connection: Connection) -> None:
        key = self._key(session)
        with self._lock:
            if self._live.get(key) is connection:
                del self._live[key]
        self._stop(connection)

    def _stop(self, connection: Connection, wait: bool = True) -> None:
        """End ``connection``; ``wait=False``: in the background (an endpoint's event loop must not wait on it)."""
        if not wait:
            Loop.submit(connection.close())
            return
        try:
            Loop.run(connection.close(), None)
        except Exception:  # a connection that fails to close is gone all the same
            pass

    def release(self, session: str) -> None:
        """End ``session``'s own connection (scope ``session``), in the background; a shared one stays."""
        if self.scope != "session":
            return
        with self._lock:
            connection = self._live.pop(session, None)
            self._opened.discard(session)
            self._locks.pop(session, None)
        if connection is not None:
            self._stop(connection, wait=False)

    def close(self) -> None:
        with self._lock:
            live, self._live = list(self._live.values()), OrderedDict()
        for connection in live:
            self._stop(connection)

    @property
    def live(self) -> int:
        with self._lock:
            return sum(c.alive for c in self._live.values())


def connect(servers: Sequence[Server | str], scope: str = "server", timeout: float = CALL_TIMEOUT_S,
            base: ToolSet | None = None, max_sessions: int = MAX_SESSIONS) -> ToolSet:
    """``base``'s tools and every server's, as one tool set that holds the servers open (close it when done).

    Each server is started and its tools listed now; a server that cannot start, or a tool name that two
    sources share (or a source and ``base``), is a ``ToolLoadError`` here, before any request.
    """
    base = base if base is not None else ToolSet()
    if servers and importlib.util.find_spec("mcp") is None:
        raise ToolLoadError(f"MCP sources need the official MCP SDK: {install_hint('mcp')}")
    sources: list[McpSource] = []
    owner = {name: "the Python tools" for name in base}
    try:
        for server in servers:
            source = McpSource(server, scope, timeout, max_sessions=max_sessions)
            if any(s.name == source.name for s in sources):
                raise ToolLoadError(f"two MCP sources are named {source.name!r}")
            sources.append(source.start())
            for spec in source.specs:
                if spec["name"] in owner:
                    raise ToolLoadError(f"tool {spec['name']!r} of MCP source {source.name!r} has the name of a tool "
                                        f"of {owner[spec['name']]}; tool names must be unique")
                owner[spec["name"]] = f"MCP source {source.name!r}"
        return ToolSet([*base.values(), *(t for s in sources for t in s.tools())], sources=[*base.sources, *sources])
    except BaseException:
        for source in sources:
            source.close()
        raise
