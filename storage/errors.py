"""Errors of the storage layer.

Every third-party database exception is translated at the boundary (:mod:`storage.database`) into
one of these; callers never see a SQLAlchemy or driver exception.

StorageError
 +-- InvalidDatabaseURL     the URL cannot be parsed or names an unknown dialect/driver (stop)
 +-- DatabaseUnavailable    cannot connect / connection lost / locked past the retry deadline
 |    +-- FillsNotPersisted fills could not be written: halt new orders, retry them later
 |    +-- DiskFull          the database's disk is full (``path`` says where): raised at once
 +-- CorruptDatabase        the file is not a database or is malformed (stop; file untouched)
 +-- SchemaBehindHead       the database needs ``tradeagent db upgrade``
 +-- SchemaAheadOfCode      the database was migrated by a newer version of this code
 +-- InvalidRecord          a value the ledger or registry refuses (unknown instrument, NaN...)
 +-- NotFound               no row with that key
 +-- InvalidTransition      a registry state change that is not allowed (e.g. promote a rejected)
 +-- PromotionConflict      another promotion for the same instrument set won the race
 +-- LeaseHeld              another live daemon session holds a lease (``holder`` says who)
 +-- CheckpointStoreError   the checkpoint file store failed
      +-- CheckpointCorrupt a stored file does not match its sha256

``DatabaseUnavailable`` is the only retryable family: the operation had no effect that was
acknowledged, and the same call may be repeated later (ledger writes are idempotent).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.values import LeaseRecord

__all__ = [
    "CheckpointCorrupt",
    "CheckpointStoreError",
    "CorruptDatabase",
    "DatabaseUnavailable",
    "DiskFull",
    "FillsNotPersisted",
    "InvalidDatabaseURL",
    "InvalidRecord",
    "InvalidTransition",
    "LeaseHeld",
    "NotFound",
    "PromotionConflict",
    "SchemaAheadOfCode",
    "SchemaBehindHead",
    "StorageError",
]


class StorageError(Exception):
    """Base of errors raised by ``storage``."""


class InvalidDatabaseURL(StorageError):
    """The database URL is malformed or names a dialect/driver that is not installed."""


class DatabaseUnavailable(StorageError):
    """The database cannot be reached now; the operation may be retried later.

    ``attempts`` is how many times the operation was tried before giving up.
    """

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class FillsNotPersisted(DatabaseUnavailable):
    """Fills could not be committed: none of ``fill_ids`` is acknowledged.

    The trading side must stop placing new orders, keep the fills in memory and call
    ``Ledger.record_fills`` again with the same fills (idempotent) until it succeeds.
    """

    def __init__(self, message: str, *, fill_ids: tuple[str, ...], attempts: int = 1) -> None:
        super().__init__(message, attempts=attempts)
        self.fill_ids = fill_ids


class DiskFull(DatabaseUnavailable):
    """The database cannot grow: its disk (or SQLite's page limit) is full; nothing of the
    operation was stored.

    ``path`` is where space is needed: the SQLite file, or the server (its URL, password
    hidden) for PostgreSQL, whose message names the file it could not extend. Raised at once,
    without the transient retries (space is freed by an operator, not in milliseconds): the
    caller keeps its writes and repeats them once the database accepts writes again.
    """

    def __init__(self, message: str, *, path: str, attempts: int = 1) -> None:
        super().__init__(message, attempts=attempts)
        self.path = path


class CorruptDatabase(StorageError):
    """The database file is not a database or is malformed; it is left untouched."""


class SchemaBehindHead(StorageError):
    """The schema is older than this code; the message names the command that fixes it."""


class SchemaAheadOfCode(StorageError):
    """The schema was written by a newer version of tradeagent than the one running."""


class InvalidRecord(StorageError):
    """A value the store refuses (unknown instrument or order, NaN price, bad quantity...)."""


class NotFound(StorageError):
    """No row has the requested key."""


class InvalidTransition(StorageError):
    """A registry state change that the checkpoint life cycle does not allow."""


class PromotionConflict(StorageError):
    """Another promotion for the same instrument set committed first; nothing was changed."""


class LeaseHeld(StorageError):
    """A lease this session wants, or held, belongs to another live session.

    ``holder`` is that lease (host, pid, session, heartbeat), or None where the row is gone.
    """

    def __init__(self, message: str, *, holder: LeaseRecord | None) -> None:
        super().__init__(message)
        self.holder = holder


class CheckpointStoreError(StorageError):
    """The checkpoint file store cannot complete the operation."""


class CheckpointCorrupt(CheckpointStoreError):
    """A stored checkpoint file does not hash to its name; it is left in place for inspection."""
