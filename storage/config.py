"""Typed settings of the storage layer (composed by ``agent.config``)."""

from __future__ import annotations

import msgspec

__all__ = ["StorageConfig"]


class StorageConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url: str = ""
    """Any SQLAlchemy URL. Empty means the embedded SQLite file ``<data_dir>/tradeagent.db``.
    ``TRADEAGENT_DB_URL`` overrides it."""
    busy_timeout_ms: int = 10_000
    """SQLite only: how long a writer waits for the lock before retrying."""
