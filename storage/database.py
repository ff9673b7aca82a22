"""The database handle: engine set-up, transactions with retry, and error translation.

:class:`Database` owns one SQLAlchemy engine (a pool of connections). It is the only place
that opens transactions; repositories (``storage.ledger``, ``storage.registry``...) pass it a
function of a :class:`~sqlalchemy.orm.Session` and never see a driver exception: every
third-party error is translated here into the ``storage.errors`` tree.

Threads: a ``Database`` may be shared by any number of threads; each call checks a
connection out of the pool for the duration of one transaction. Calls block (disk or network
I/O, and up to ``retry_deadline_s`` of retries), so asyncio code calls them through
``asyncio.to_thread`` or a dedicated writer thread, never on the event loop.

SQLite (embedded default): WAL journal, ``synchronous`` FULL by default (an acknowledged
commit survives power loss; NORMAL survives a process kill only), ``busy_timeout``, foreign
keys on, all set in a ``connect`` event. Write transactions start with ``BEGIN IMMEDIATE`` so
that two processes never deadlock upgrading a read lock (SQLite would answer "database is
locked" at once); read transactions start with a plain ``BEGIN`` and see one snapshot.

Retries: a write that fails for a transient reason (SQLite busy/locked, I/O error; PostgreSQL
connection lost or refused, serialization failure, deadlock) is rolled back and retried with
exponential backoff and jitter until ``retry_deadline_s``; then the caller gets
:class:`DatabaseUnavailable` (or the error its ``give_up`` builds, e.g. ``FillsNotPersisted``).
A full disk (SQLite ``SQLITE_FULL`` "database or disk is full", also when ``max_page_count``
is reached; PostgreSQL ``53100`` disk_full, "could not extend file") is rolled back and raised
at once as :class:`DiskFull`, naming where space is needed: it lasts until an operator frees
space, and the caller keeps its writes meanwhile.
A result is returned only after COMMIT succeeded: nothing is acknowledged that is not durable.
A commit whose outcome is unknown (connection lost during COMMIT) is retried too. The writes
whose repetition would matter are idempotent (orders, fills, instruments, candidates,
promotions, rejections, rollbacks, floors' current value); an append-only record (a train run,
gate event, floor history entry, event or session) could in that rare case be stored twice.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from storage.config import StorageConfig
from storage.errors import (
    CorruptDatabase,
    DatabaseUnavailable,
    DiskFull,
    InvalidDatabaseURL,
    InvalidRecord,
    StorageError,
)
from storage.url import display_url, mask_secrets

__all__ = ["Database", "GiveUp"]

log = logging.getLogger(__name__)

T = TypeVar("T")

GiveUp = Callable[[str, int], StorageError]
"""Builds the error a caller gets when retries are exhausted: ``(message, attempts)``."""

_READ_OPTION = "tradeagent_read_only"
_FIRST_BACKOFF_S = 0.02
_MAX_BACKOFF_S = 1.0
# psycopg / PostgreSQL SQLSTATEs worth retrying: serialization failure, deadlock,
# admin/crash shutdown, cannot connect now; class 08 (connection exceptions) is matched by prefix.
_PG_TRANSIENT_STATES = {"40001", "40P01", "57P01", "57P02", "57P03"}
_SQLITE_CORRUPT = ("file is not a database", "malformed", "not a database")
_SQLITE_TRANSIENT = ("locked", "busy", "disk i/o error", "unable to open database file", "readonly")
_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"


def _is_corrupt(orig: BaseException) -> bool:
    return isinstance(orig, sqlite3.DatabaseError) and any(m in str(orig).lower() for m in _SQLITE_CORRUPT)


def _is_disk_full(orig: BaseException) -> bool:
    """SQLite's SQLITE_FULL (primary result code 13) or PostgreSQL's disk_full SQLSTATE."""
    if isinstance(orig, sqlite3.Error):
        return orig.sqlite_errorcode & 0xFF == _SQLITE_FULL
    return getattr(orig, "sqlstate", None) == _PG_DISK_FULL


def _is_transient(exc: BaseException) -> bool:
    """True when retrying the same transaction later may succeed."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        orig: BaseException = exc.orig if exc.orig is not None else exc
    else:
        orig = exc
    if isinstance(orig, sqlite3.OperationalError):
        return any(m in str(orig).lower() for m in _SQLITE_TRANSIENT)
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        return state in _PG_TRANSIENT_STATES or state.startswith("08")
    module = type(orig).__module__
    # psycopg raises OperationalError/InterfaceError without a SQLSTATE when the server is
    # unreachable or the connection dropped.
    return module.startswith("psycopg") and type(orig).__name__ in ("OperationalError", "InterfaceError")


class Database:
    """One database: its engine, its transactions and its retry policy.

    Build it with :func:`storage.open_database` (which also checks or migrates the schema);
    repositories take it as their only argument. ``close()`` (or ``with``) releases the pool.
    """

    def __init__(self, url: URL, config: StorageConfig) -> None:
        self.url = url
        self.display_url = display_url(url)
        """The URL with its password hidden: safe to log."""
        self.dialect: str = url.get_backend_name()
        self.retry_deadline_s = config.retry_deadline_s
        self._engine = _build_engine(url, config)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False, autoflush=False)
        self._read_sessions = sessionmaker(
            self._engine.execution_options(**{_READ_OPTION: True}), expire_on_commit=False, autoflush=False
        )

    @property
    def sqlite_path(self) -> Path | None:
        """The database file when the dialect is SQLite, else None."""
        return Path(self.url.database) if self.dialect == "sqlite" and self.url.database else None

    def close(self) -> None:
        """Close every pooled connection (idempotent)."""
        self._engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(
        self,
        work: Callable[[Session], T],
        *,
        what: str,
        give_up: GiveUp | None = None,
        on_integrity: Callable[[IntegrityError], StorageError] | None = None,
        retry: bool = True,
    ) -> T:
        """Run ``work(session)`` in one write transaction, commit, and return its result.

        Transient failures are retried (with backoff, up to ``retry_deadline_s``) when
        ``retry``; ``give_up(message, attempts)`` builds the error raised when they run out
        (default :class:`DatabaseUnavailable`). A constraint violation becomes
        ``on_integrity(exc)`` (default :class:`InvalidRecord`). ``what`` names the operation in
        messages. For use by the storage repositories only.
        """
        return self._run(
            self._sessions, work, what=what, give_up=give_up, on_integrity=on_integrity, retry=retry
        )

    def read(self, work: Callable[[Session], T], *, what: str, retry: bool = True) -> T:
        """Run ``work(session)`` in one read transaction (one consistent snapshot)."""
        return self._run(self._read_sessions, work, what=what, give_up=None, on_integrity=None, retry=retry)

    def ping(self) -> None:
        """Open one connection and run a trivial query, without retrying (start-up check)."""
        self.read(lambda s: s.execute(text("SELECT 1")).scalar_one(), what="connect", retry=False)

    def connection(self, *, read_only: bool = False) -> Connection:
        """A raw connection for schema work (``storage.schema``) only.

        On SQLite its transactions begin with ``BEGIN IMMEDIATE`` (the write lock) unless
        ``read_only``.
        """
        engine = self._engine.execution_options(**{_READ_OPTION: True}) if read_only else self._engine
        try:
            return engine.connect()
        except SQLAlchemyError as exc:
            raise self.translate(exc, what="connect") from None

    def translate(self, exc: BaseException, *, what: str, attempts: int = 1) -> StorageError:
        """Map a SQLAlchemy/driver exception to the ``storage.errors`` tree (password hidden)."""
        orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        lines = str(orig).strip().splitlines()
        detail = mask_secrets(lines[0]) if lines else type(orig).__name__
        where = f"{what} on {self.display_url}"
        if _is_corrupt(orig):
            return CorruptDatabase(
                f"{where}: the database file is corrupt ({detail}); it was left untouched for "
                "inspection: restore it from a backup or move it aside"
            )
        if _is_disk_full(orig):
            path = str(self.sqlite_path) if self.sqlite_path is not None else self.display_url
            return DiskFull(
                f"{where}: disk full at {path} ({detail}): free space there; nothing of this call was stored",
                path=path,
                attempts=attempts,
            )
        if isinstance(exc, IntegrityError):
            return InvalidRecord(f"{where}: refused by a database constraint: {detail}")
        if _is_transient(exc):
            return DatabaseUnavailable(f"{where}: database unavailable: {detail}", attempts=attempts)
        return StorageError(f"{where}: {detail}")

    def _run(
        self,
        factory: sessionmaker[Session],
        work: Callable[[Session], T],
        *,
        what: str,
        give_up: GiveUp | None,
        on_integrity: Callable[[IntegrityError], StorageError] | None,
        retry: bool,
    ) -> T:
        deadline = time.monotonic() + self.retry_deadline_s
        backoff = _FIRST_BACKOFF_S
        attempts = 0
        while True:
            attempts += 1
            try:
                with factory() as session, session.begin():
                    result = work(session)
                return result
            except IntegrityError as exc:
                if on_integrity is not None:
                    raise on_integrity(exc) from None
                raise self.translate(exc, what=what) from None
            except (SQLAlchemyError, sqlite3.Error) as exc:
                error = self.translate(exc, what=what, attempts=attempts)
                if not isinstance(error, DatabaseUnavailable) or isinstance(error, DiskFull):
                    raise error from None
                pause = backoff * (0.5 + random.random())
                if not retry or time.monotonic() + pause > deadline:
                    message = f"{error} (gave up after {attempts} attempt(s))"
                    raise (give_up or _unavailable)(message, attempts) from None
                log.warning("%s: %s; retrying in %.2fs (attempt %d)", what, error, pause, attempts)
                time.sleep(pause)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)


def _unavailable(message: str, attempts: int) -> StorageError:
    return DatabaseUnavailable(message, attempts=attempts)


def _build_engine(url: URL, config: StorageConfig) -> Engine:
    """Create the engine with the dialect's durability and connection settings."""
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        kwargs["pool_pre_ping"] = True
        kwargs["connect_args"] = {
            "connect_timeout": max(1, round(config.connect_timeout_s)),
            "application_name": "tradeagent",
        }
    try:
        engine = create_engine(url, **kwargs)
    except NoSuchModuleError:
        raise InvalidDatabaseURL(f"database URL {display_url(url)!r}: driver not installed") from None
    except (ArgumentError, TypeError) as exc:
        raise InvalidDatabaseURL(f"database URL {display_url(url)!r}: {exc}") from None
    if url.get_backend_name() == "sqlite":
        _install_sqlite_pragmas(engine, config)
    return engine


def _install_sqlite_pragmas(engine: Engine, config: StorageConfig) -> None:
    busy_ms = int(config.busy_timeout_ms)
    synchronous = config.sqlite_synchronous.upper()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN, so that writes can take the lock up front.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        read_only = connection.get_execution_options().get(_READ_OPTION, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
