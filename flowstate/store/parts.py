"""A run record's large parts that repeat request after request — the specs of the tools a request offered and the
policy its system prompt held — stored once per session: the record keeps ``{"$part": SHA256}`` in their place and
every read puts them back (``whole``), so a record reads, exports and replays as it was written. Parts belong to
their session (``record_parts``, deleted with it, shared by no other session); a part under ``MIN_BYTES`` stays
inline, where a reference would be no smaller."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from flowstate.errors import StorageError
from flowstate.nodes import canonical_json
from flowstate.store.backends import Conn

PARTS = ("tools", "policy")
MIN_BYTES = 256
REF = "$part"


def lean(conn: Conn, record: dict[str, Any], sid_sql: str, sid_args: Sequence[Any]) -> dict[str, Any]:
    """``record`` with each large part stored in ``record_parts`` under its digest (once a session: a part stored
    before is not written again) and referenced; ``sid_sql`` is the SQL that gives the session's id."""
    out = dict(record)
    for key in PARTS:
        if record.get(key) is None:
            continue
        body = canonical_json(record[key])
        data = body.encode()
        if len(data) < MIN_BYTES:
            continue
        digest = hashlib.sha256(data).hexdigest()
        conn.execute(f"INSERT INTO record_parts (session_id, digest, body) VALUES ({sid_sql}, ?, ?)"
                     " ON CONFLICT (session_id, digest) DO NOTHING", (*sid_args, digest, body))
        out[key] = {REF: digest}
    return out


def whole(conn: Conn, record: dict[str, Any], sid: int, read: dict[tuple[int, str], Any] | None = None
          ) -> dict[str, Any]:
    """``record`` (stored by session ``sid``) with its referenced parts put back; ``read`` keeps the parts already
    read across calls (an export reads a session's parts once, not once a request)."""
    refs = {k: v[REF] for k in PARTS if isinstance(v := record.get(k), dict) and REF in v}
    if not refs:
        return record
    read = {} if read is None else read
    wanted = sorted({d for d in refs.values() if (sid, d) not in read})
    if wanted:
        marks = ", ".join("?" for _ in wanted)
        for digest, body in conn.execute(f"SELECT digest, body FROM record_parts WHERE session_id = ? AND digest IN"
                                         f" ({marks})", (sid, *wanted)).fetchall():
            read[sid, digest] = json.loads(body)
    missing = sorted(d for d in refs.values() if (sid, d) not in read)
    if missing:
        raise StorageError(f"a run record of session id {sid} names part {missing[0]}, which is not stored")
    return {**record, **{k: read[sid, d] for k, d in refs.items()}}
