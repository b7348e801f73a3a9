"""Where the repository's rows live: SQLite (one file, embedded, the default) or PostgreSQL (a server that
several FlowState processes share), chosen by the target: a path, or a ``postgresql://`` URL.

Both give the repository the same three things: reads, one write transaction at a time per request
(committed when it ends, rolled back when it raises), and named idempotent migrations. PostgreSQL also
gives a lock per session that holds across processes (``session_lock``), so two servers never run two
turns of one session at once; the database itself refuses to change history on both (triggers).
"""

from __future__ import annotations

import difflib
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from engine.distribution import install_hint
from flowstate.errors import StorageError
from flowstate.store import migrations

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str | Path) -> bool:
    return str(target).startswith(POSTGRES_SCHEMES)


def redact(url: str) -> str:
    """A URL without its password, for messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


class Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """What the repository runs SQL on; placeholders are ``?`` on both backends."""

    def execute(self, sql: str, args: Sequence[Any] = ...) -> Cursor: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any: ...


class Backend(Protocol):
    label: str

    def read(self) -> Any: ...
    def write(self, what: str) -> Any: ...
    def session_lock(self, session: str) -> Any: ...
    def close(self) -> None: ...


def _wal(conn: sqlite3.Connection, patience_s: float = 30.0) -> None:
    """Put the database in WAL mode. Switching a new file's journal mode needs it to itself, and SQLite answers
    "database is locked" at once (its busy timeout does not wait here) while another process opening the same new
    file is mid-way: servers starting together retry until the file is theirs or ``patience_s`` has passed."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class SqliteBackend:
    """One connection, serialized by a lock; WAL, foreign keys, synchronous writes."""

    def __init__(self, path: str, *, create: bool) -> None:
        self.label = path
        if path != ":memory:":
            fp = Path(path)
            if not create and not fp.exists():
                raise StorageError(f"no database at {path}")
            if fp.exists() and not fp.is_file():
                raise StorageError(f"cannot open database {path}: not a regular file")
            if create and not fp.parent.is_dir():  # a mistyped folder is an error, not a new empty memory
                raise StorageError(f"cannot open database {path}: the folder {fp.parent} does not exist")
        self._lock = threading.RLock()
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA recursive_triggers = ON")  # a REPLACE's deletions fire DELETE triggers
            conn.execute("PRAGMA secure_delete = ON")  # per connection, whatever the build's default: deleted rows
            #                                           are overwritten with zeros (erasure: flowstate/store/erasure.py)
            if path != ":memory:":
                _wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            if not create:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if "schema_migrations" not in tables:
                    raise StorageError(f"cannot open database {path}: not a FlowState database")
            migrations.apply_sqlite(conn)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open database {path}: {exc}") from exc
        self._conn = conn

    @contextmanager
    def read(self) -> Iterator[Conn]:
        with self._lock:
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise StorageError(f"database {self.label}: {exc}") from exc

    @contextmanager
    def write(self, what: str) -> Iterator[Conn]:
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StorageError(f"database {self.label}: {what}: {exc}") from exc

    @contextmanager
    def session_lock(self, session: str) -> Iterator[None]:
        yield  # one process per SQLite file serves a session; its own locks serialize turns

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _Pg:
    """A psycopg connection that takes the repository's ``?`` placeholders."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        return self.conn.execute(sql.replace("?", "%s"), tuple(args))  # type: ignore[no-any-return]

    def once(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        """Execute never as a prepared statement: for a statement whose best plan depends on its values (psycopg
        prepares a statement run five times, and PostgreSQL may then keep a generic plan that cannot see them — for
        a full-text query, how common its words are)."""
        return self.conn.execute(sql.replace("?", "%s"), tuple(args), prepare=False)  # type: ignore[no-any-return]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:  # psycopg pipelines the rows: one round trip, not one per row
            cur.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])


class PostgresBackend:
    """A connection pool (psycopg 3); each read or write borrows a connection."""

    def __init__(self, url: str, *, create: bool, pool_size: int = 8, lock_pool_size: int = 64) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StorageError(f"a PostgreSQL database needs psycopg ({exc.name} is missing): "
                               f"{install_hint('postgres')}") from exc

        self._errors = (psycopg.Error,)
        self.label = redact(url)
        try:  # one connection first: the server's own error at once (refused, authentication, no such database),
            psycopg.connect(url, autocommit=True).close()  # where the pool would only time out
        except psycopg.Error as exc:
            raise StorageError(f"cannot open database {self.label}: {str(exc).strip()}") from exc
        try:
            self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, kwargs={"autocommit": True},
                                        open=False, name="flowstate")
            self._pool.open(wait=True, timeout=15.0)
            # a held session lock keeps its connection (advisory locks belong to one): a pool of their own
            self._locks = ConnectionPool(url, min_size=0, max_size=lock_pool_size, kwargs={"autocommit": True},
                                         open=True, name="flowstate-locks")
        except Exception as exc:  # the pool reports a server it cannot reach as a timeout
            raise StorageError(f"cannot open database {self.label}: {exc}") from exc
        try:
            with self._pool.connection() as conn:
                if not create:
                    found = conn.execute("SELECT to_regclass('schema_migrations')").fetchone()
                    if found is None or found[0] is None:
                        raise StorageError(f"cannot open database {self.label}: not a FlowState database")
                migrations.apply_postgres(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            self.close()
            raise StorageError(f"cannot open database {self.label}: its schema needs migrations this role may not "
                               f"run ({str(exc).splitlines()[0]}): open it once as the tables' owner") from exc
        except psycopg.Error as exc:
            self.close()
            raise StorageError(f"cannot open database {self.label}: {exc}") from exc
        except StorageError:
            self.close()
            raise

    def read(self) -> AbstractContextManager[Conn]:
        return self._connection(None)

    def write(self, what: str) -> AbstractContextManager[Conn]:
        """A transaction in pipeline mode: statements whose results are not read go out without a round trip each."""
        return self._connection(what)

    @contextmanager
    def _connection(self, transaction: str | None) -> Iterator[Conn]:
        """A pooled connection, inside a transaction when it is one (``transaction`` says what it does)."""
        try:
            with self._pool.connection() as conn:
                if transaction is None:
                    yield _Pg(conn)
                else:
                    with conn.pipeline(), conn.transaction():
                        yield _Pg(conn)
        except self._errors as exc:
            doing = f"{transaction}: " if transaction is not None else ""
            raise StorageError(f"database {self.label}: {doing}{exc}") from exc

    @contextmanager
    def session_lock(self, session: str) -> Iterator[None]:
        """Hold the session's advisory lock (every process on this database waits for it) for the block."""
        try:
            with self._locks.connection() as conn:
                conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (session,))
                try:
                    yield
                finally:
                    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (session,))
        except self._errors as exc:
            raise StorageError(f"database {self.label}: lock of session {session!r}: {exc}") from exc

    @contextmanager
    def try_lock(self, key: int) -> Iterator[bool]:
        """Try the advisory lock ``key`` without waiting; hold it for the block if it was free (the value says)."""
        try:
            with self._locks.connection() as conn:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                got = row is not None and bool(row[0])
                try:
                    yield got
                finally:
                    if got:
                        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        except self._errors as exc:
            raise StorageError(f"database {self.label}: advisory lock {key:#x}: {exc}") from exc

    def close(self) -> None:
        self._locks.close()
        self._pool.close()


SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
SQLITE_URL = "sqlite:///"  # SQLAlchemy's form: sqlite:///relative.db, sqlite:////absolute/path.db


def sqlite_path(target: str | Path) -> str:
    """The SQLite file a target names: a path as it is, ``sqlite:///PATH`` as that path; any other ``scheme://`` (a
    database FlowState does not store in, or a misspelt ``postgresql://``) refused by name, never taken for a file
    of that name."""
    text = str(target)
    scheme = SCHEME.match(text)
    if scheme is None:
        return text
    if text.startswith(SQLITE_URL) and len(text) > len(SQLITE_URL):
        return text[len(SQLITE_URL):]
    name = scheme.group(1)
    near = difflib.get_close_matches(name.lower(), ["postgresql", "postgres", "sqlite"], n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}://?)" if near and near[0] != name.lower() else ""
    raise StorageError(f"cannot open database {redact(text)}: FlowState keeps memory in SQLite (a file path, or "
                       f"sqlite:///PATH) or PostgreSQL (postgresql://…), not {name}://{hint}")


def open_backend(target: str | Path, *, create: bool = True) -> SqliteBackend | PostgresBackend:
    text = str(target)
    return PostgresBackend(text, create=create) if is_postgres(text) else SqliteBackend(sqlite_path(text),
                                                                                        create=create)
