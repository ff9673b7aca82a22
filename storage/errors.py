"""Errors of the storage layer.

StorageError
 +-- DatabaseUnavailable  cannot connect / connection lost (retryable)
 +-- SchemaBehindHead     the database needs ``tradeagent db upgrade``
"""

from __future__ import annotations

__all__ = ["DatabaseUnavailable", "SchemaBehindHead", "StorageError"]


class StorageError(Exception):
    """Base of errors raised by ``storage``."""


class DatabaseUnavailable(StorageError):
    """The database cannot be reached now; the operation may be retried later."""


class SchemaBehindHead(StorageError):
    """The schema is older than this code; the message names the command that fixes it."""
