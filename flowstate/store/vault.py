"""The vault: each value redaction replaced, encrypted at rest (Fernet: AES-128-CBC with HMAC-SHA256, from
``cryptography``) under a key the server is given (``--vault-key``, ``$FLOWSTATE_VAULT_KEY``) and the database never
holds, by session and placeholder. It is read only to restore placeholders in a tool call's arguments just before the
tool runs; never indexed, exported or shown. Its rows go with their session (``flowstate/store/forget.py``), so
deleting, expiring or erasing a session empties its part of the vault.

What an operator with database access can recover: nothing of a redacted value without the key (the placeholder is
a keyed digest, the value encrypted). With the key, every value the vault holds — it is the one secret to guard, and
rotating it means re-keying the vault (not built yet)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from engine.distribution import install_hint
from flowstate.errors import StorageError
from flowstate.nodes import Node
from flowstate.store.backends import Backend, Conn
from flowstate.store.redaction import KINDS, Detector, Redacted, Redactor, placeholders, restore


class VaultKeyError(StorageError):
    pass


def _fernet(key: str) -> object:
    try:
        from cryptography.fernet import Fernet
    except ImportError as exc:
        raise VaultKeyError(f"the vault needs cryptography: {install_hint('redact')}") from exc
    try:
        return Fernet(key.encode())
    except (ValueError, TypeError) as exc:
        raise VaultKeyError("the vault key must be a Fernet key: 32 url-safe base64-encoded bytes (make one with "
                            "flowstate vault-key)"
                            ) from exc


def new_key() -> str:
    """A new Fernet key — 32 random bytes, url-safe base64, as ``Fernet.generate_key`` makes it — with no
    cryptography installed (``flowstate vault-key``: the key is made before the redact extra is needed)."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


class Vault:
    """Sealed values by (session, placeholder), in the repository's database, under ``key``."""

    def __init__(self, backend: Backend, key: str) -> None:
        self._db = backend
        self._box = _fernet(key)
        # the placeholders' digest key: derived from the vault's, never stored
        self.digest_key = hashlib.sha256(b"flowstate-redaction\x00" + base64.urlsafe_b64decode(key.encode())).digest()

    def seal(self, conn: Conn, session: str, values: Mapping[str, tuple[str, str]]) -> None:
        """Keep ``values`` (placeholder -> (kind, value)) of ``session``, in the caller's transaction."""
        if values:
            conn.executemany("INSERT INTO vault (session, placeholder, kind, sealed) VALUES (?, ?, ?, ?) "
                             "ON CONFLICT (session, placeholder) DO NOTHING",
                             [(session, ph, kind, self._box.encrypt(value.encode()).decode())  # type: ignore[attr-defined]
                              for ph, (kind, value) in sorted(values.items())])

    def open(self, scope: str, wanted: Iterable[str]) -> dict[str, str]:
        """The values of the placeholders ``wanted`` that any session of the namespace ``scope`` keeps (a placeholder
        is keyed by its namespace: every session of it that holds one holds the same value)."""
        names = sorted(set(wanted))
        if not names:
            return {}
        marks = ", ".join("?" for _ in names)
        with self._db.read() as conn:
            rows = conn.execute(f"SELECT placeholder, sealed FROM vault WHERE placeholder IN ({marks}) AND "
                                "substr(session, 1, ?) = ?", (*names, len(scope), scope)).fetchall()
        return {ph: self._box.decrypt(sealed.encode()).decode() for ph, sealed in rows}  # type: ignore[attr-defined]


class Redaction:
    """What the repository stores, redacted (``flowstate/store/redaction.py``) — a request's query, response, states,
    observations, run record and transcript; a waiting request's snapshot; stored responses; conversations'
    metadata — with the values it replaced kept in the vault, and restored from there for a tool's arguments."""

    def __init__(self, backend: Backend, key: str, kinds: Iterable[str] = KINDS) -> None:
        self.vault = Vault(backend, key)
        self.redactor = Redactor(Detector(kinds), self.vault.digest_key)
        self.kinds = self.redactor.detector.kinds

    @staticmethod
    def scope(session: str) -> str:
        """The namespace a session's placeholders are keyed in: its tenant's ('' on an open server)."""
        return session[:session.rfind("/") + 1]

    def value(self, session: str, value: Any, into: Redacted | None = None) -> Any:
        """A JSON value of ``session`` with every string redacted; what was replaced goes ``into``."""
        return self.redactor.deep(self.scope(session), value, into)

    def request(self, session: str, query: str, response: str | None, nodes: Sequence[Node], record: dict[str, Any],
                transcript: Any) -> tuple[str, str | None, list[Node], dict[str, Any], Any, Redacted]:
        """A request's parts as they will be stored, and what was replaced (its counts per kind also in the
        record's ``redactions``)."""
        found = Redacted()

        def red(v: Any) -> Any:
            return self.value(session, v, found)

        nodes = [n.model_copy(update={"summary": red(n.summary), "value": red(n.value)}) for n in nodes]
        record = red(record)
        if transcript is not None:
            transcript = replace(transcript, messages=red(transcript.messages))
        query, response = red(query), red(response)
        record["redactions"] = dict(sorted(found.counts.items()))
        return query, response, nodes, record, transcript, found

    def restore(self, session: str, arguments: Any) -> Any:
        """A tool call's arguments with the placeholders the vault knows for the session's tenant restored."""
        wanted = placeholders(arguments)
        if not wanted:
            return arguments
        return restore(arguments, self.vault.open(self.scope(session), wanted))
