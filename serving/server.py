"""Run the app under uvicorn, saying at start how it is exposed."""

from __future__ import annotations

import ipaddress
import sys

import uvicorn

from serving.app import ServerConfig, create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve until interrupted."""
    where = f"http://{host}:{port}/v1"
    if config.keys:
        note = f"{len(config.keys)} API key(s); sessions are namespaced by key"
    elif is_loopback(host):
        note = "no API keys: loopback only, every local client can reach every session"
    else:
        note = "WARNING: no API keys on a non-loopback address: anyone who can connect can read every session"
    print(f"FlowState serving {config.model_id!r} ({config.engine.name}) at {where} — {note}", file=sys.stderr, flush=True)
    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level)
