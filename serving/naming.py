"""Which session a call names: session names (the
``X-FlowState-Session`` header, else ``user``), and a session's key within the server."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from serving.errors import bad_request

SESSION_HEADER = "x-flowstate-session"
MAX_NAME = 200
_NAME_PUNCT = frozenset("._-:@+=~")


@dataclass(frozen=True)
class SessionKey:
    """A session as the server names it: the caller's key namespace and the session's name within it."""

    namespace: str  # "" without API keys
    name: str

    @property
    def full(self) -> str:
        """The name in the repository and the registry."""
        return self.namespace + self.name


NAME_RULE = (f"a session name is 1 to {MAX_NAME} characters: letters and digits (any script), and . _ - : @ + = ~; "
             "not '.' or '..'")


def check_name(name: str, param: str = "user") -> str:
    """A session name as given (header or ``user``), or 400: names must be reachable at /v1/sessions/{name}."""
    name = unicodedata.normalize("NFC", name)
    if not (0 < len(name) <= MAX_NAME) or name in (".", "..") or not all(c.isalnum() or c in _NAME_PUNCT for c in name):
        raise bad_request(f"invalid session name {name[:60]!r}: {NAME_RULE}", param, "invalid_session")
    return name


def header_text(value: str | None, header: str) -> str | None:
    """A header value as UTF-8 text (HTTP hands header bytes over as Latin-1)."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise bad_request(f"the {header} header is not UTF-8", header, "invalid_header") from None


def session_name(header: str | None, user: str | None) -> str | None:
    """The header's name, else ``user``'s, else None (the server picks one by fingerprint)."""
    if header is not None:
        return check_name(header, SESSION_HEADER)
    if user is not None:
        return check_name(user)
    return None
