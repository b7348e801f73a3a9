"""Run the app under uvicorn, saying at start how it is exposed."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import sys

import uvicorn

from serving.app import create_app
from serving.services import ServerConfig

HEADER_TIMEOUT_S = 10.0  # a client must send a request's headers within this


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def header_timeout_protocol(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol, closing connections whose request headers take longer than ``seconds``
    (uvicorn itself waits forever: one slow client per connection could hold the server's sockets)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeout(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._waiting_for: object = None
            self._arm()

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(seconds, self._late)
            self._waiting_for = self.cycle

        def _late(self) -> None:
            if not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not self._waiting_for:  # a request's headers arrived in full
                self._deadline.cancel()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._deadline.cancel()
                self._arm()  # the next request on this connection gets the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.cancel()
            super().connection_lost(exc)

    return HeaderTimeout


class PathOnly(logging.Filter):
    """uvicorn's access log lines with each request's path only: a query string (a search's words, a cursor, an
    e-mail address a client filters by) is data, which the log would keep beyond redaction and erasure."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?…", *args[3:])
        return True


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          header_timeout_s: float = HEADER_TIMEOUT_S) -> None:
    """Serve until interrupted."""
    where = f"http://{host}:{port}/v1"
    app = create_app(config)
    if not app.state.services.auth.open:
        note = (f"{len(config.keys)} static API key(s), {len(config.admin_keys)} admin key(s), tenants' keys from the "
                "database; sessions are namespaced by tenant")
    elif is_loopback(host):
        note = "no API keys: loopback only, every local client can reach every session"
    else:
        note = "WARNING: no API keys on a non-loopback address: anyone who can connect can read every session"
    print(f"FlowState serving {config.model_id!r} ({config.engine.name}) at {where} — {note}", file=sys.stderr,
          flush=True)
    _log_to_stderr(log_level)
    logging.getLogger("uvicorn.access").addFilter(PathOnly())
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                http=header_timeout_protocol(header_timeout_s))


def _log_to_stderr(level: str) -> None:
    """FlowState's own log lines (``flowstate.*``: a retention sweep's counts, a background response's end) on stderr
    at the server's ``--log-level``, as uvicorn writes its own: uvicorn configures only its loggers, and without a
    handler Python prints WARNING and above alone."""
    logger = logging.getLogger("flowstate")
    logger.setLevel(level.upper() if level != "trace" else "DEBUG")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
