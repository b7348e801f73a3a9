"""One live MCP client session, and the event loop every connection of the process runs on.

The MCP SDK is asynchronous; FlowState calls tools from the driver's threads. So the connections live on one
event loop of their own, on a daemon thread: each connection is one task there that holds its transport (a
server process over stdio, or a streamable-HTTP session) and its ``ClientSession`` open until it is closed, and
calls are submitted to it from any thread and waited on with a timeout. A server that exits, hangs or breaks
the protocol ends its connection; the caller starts a new one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shlex
import tempfile
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar, cast

from pydantic import ValidationError

T = TypeVar("T")

CONNECTION_CLOSED = -32000
"""The JSON-RPC error code the SDK gives a request whose connection ended (``mcp_types.CONNECTION_CLOSED``)."""
STOP_TIMEOUT_S = 5.0
"""How long a closing connection may take to end its server (stdio: stdin closed, then terminate, then kill)."""


class ConnectionLost(Exception):
    """The connection ended (the server exited, or broke the protocol): the next call starts a new one."""


@dataclass(frozen=True)
class Server:
    """An MCP server as a tool source names it: ``NAME=COMMAND`` (stdio) or ``NAME=URL`` (streamable HTTP)."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Server:
        name, sep, target = spec.partition("=")
        name, target = name.strip(), target.strip()
        if not sep or not name or not target:
            raise ValueError(f"an MCP source is NAME=COMMAND or NAME=URL, got {spec!r}")
        if not all(c.isalnum() or c in "_-" for c in name):
            raise ValueError(f"an MCP source's name is letters, digits, _ and -, got {name!r}")
        if target.startswith(("http://", "https://")):
            return cls(name, url=target)
        try:
            command = tuple(shlex.split(target))
        except ValueError as exc:
            raise ValueError(f"MCP source {name!r}: cannot split the command {target!r}: {exc}") from None
        return cls(name, command=command)

    def __str__(self) -> str:
        return f"{self.name}={self.url or shlex.join(self.command)}"


class Loop:
    """The one event loop of the process's MCP connections, started on first use."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="flowstate-mcp", daemon=True).start()
                cls._loop = loop
            return cls._loop

    @classmethod
    def submit(cls, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` on the loop without waiting for it."""
        asyncio.run_coroutine_threadsafe(coro, cls.get())

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it (``TimeoutError`` past ``timeout``: the coroutine is cancelled)."""
        future = asyncio.run_coroutine_threadsafe(coro, cls.get())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None


def describe(exc: BaseException) -> str:
    """An exception (an exception group's leaves, as anyio raises them) as one line."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(describe(e) for e in exc.exceptions))
    if isinstance(exc, ValidationError):  # what the SDK could not read as the message it expected
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the message"
        return f"a malformed {exc.title} ({where}: {first['msg']})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Connection:
    """One client session with ``server``; ``open()``, ``call()`` and ``close()`` run on ``Loop``."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.errlog: TextIO | None = None if server.url else cast(TextIO, tempfile.TemporaryFile(
            "w+", encoding="utf-8", errors="replace"))
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self.failure: str | None = None
        self.stderr = ""  # the last lines the server wrote to stderr, kept when the connection closes

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done() and self.failure is None

    def stderr_tail(self, lines: int = 5, chars: int = 600) -> str:
        """The last lines the server wrote to stderr (stdio), for an error message."""
        if self.errlog is None:
            return ""
        try:
            self.errlog.flush()
            self.errlog.seek(0)
            tail = "\n".join(self.errlog.read().strip().splitlines()[-lines:])
        except (OSError, ValueError):
            return ""
        return tail[-chars:]

    def _transport(self) -> Any:
        if self.server.url:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.server.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        command, *args = self.server.command
        assert self.errlog is not None  # made for every stdio server
        return stdio_client(StdioServerParameters(command=command, args=args), errlog=self.errlog)

    async def open(self) -> list[Any]:
        """Start the server (stdio) or session (HTTP), initialize, and list its tools (``mcp.types.Tool``)."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = loop.create_future()
        self._stop = asyncio.Event()
        self._task = loop.create_task(self._hold(ready, self._stop))
        done, _ = await asyncio.wait([ready, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
        if ready.cancelled() or ready.exception() is not None:
            raise ConnectionLost(self.failure or "the connection ended before it was initialized")
        self._session = ready.result()
        tools: list[Any] = []
        cursor = None
        while True:
            page = await self._session.list_tools(cursor=cursor) if cursor else await self._session.list_tools()
            tools += page.tools
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                return tools

    async def _hold(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        from mcp import ClientSession

        async def on_message(message: Any) -> None:
            if isinstance(message, Exception):  # a line that is not JSON-RPC: the stream cannot be trusted
                self.failure = f"it broke the protocol ({describe(message)})"
                stop.set()

        try:
            async with self._transport() as streams, ClientSession(streams[0], streams[1],
                                                                   message_handler=on_message) as session:
                await session.initialize()
                if not ready.done():
                    ready.set_result(session)
                await stop.wait()
        except Exception as exc:  # whatever ended the connection is reported to its callers
            self.failure = self.failure or describe(exc)
        finally:
            if not ready.done():
                ready.set_exception(ConnectionLost(self.failure or "closed"))
            self.failure = self.failure or "the connection was closed"

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool (``mcp.types.CallToolResult``); ``ConnectionLost`` when the connection ends first."""
        if not self.alive:
            raise ConnectionLost(self.failure or "not open")
        assert self._task is not None
        call = asyncio.ensure_future(self._session.call_tool(name, arguments))
        try:
            await asyncio.wait([call, self._task], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller's timeout
            call.cancel()
            raise
        if not call.done():
            call.cancel()
            raise ConnectionLost(self.failure or "the connection ended")
        try:
            return call.result()  # the SDK's other errors (an MCPError the server sent) are the caller's to word
        except Exception as exc:
            if getattr(getattr(exc, "error", None), "code", None) != CONNECTION_CLOSED:
                raise
            self.failure = self.failure or "the server closed the connection (it exited)"
            if self._stop is not None:
                self._stop.set()
            raise ConnectionLost(self.failure) from None

    async def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), STOP_TIMEOUT_S)
            except (TimeoutError, asyncio.TimeoutError):
                self._task.cancel()
        if self.errlog is not None:
            self.stderr = self.stderr_tail()
            self.errlog.close()
