"""Typed settings of the storage layer (composed by ``agent.config``)."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["StorageConfig"]


class StorageConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url: str = ""
    """Any SQLAlchemy URL. Empty means the embedded SQLite file ``<data_dir>/tradeagent.db``.
    ``TRADEAGENT_DB_URL`` overrides it."""
    busy_timeout_ms: int = 10_000
    """SQLite only: how long a writer waits for the lock before retrying."""
    sqlite_synchronous: Literal["full", "normal"] = "full"
    """SQLite only. ``full``: a committed (acknowledged) fill survives power loss. ``normal``
    (WAL): survives a process kill but may lose the last commits on power loss; faster."""
    retry_deadline_s: float = 30.0
    """How long a write keeps retrying transient failures (lock held, connection lost) with
    exponential backoff before the caller gets ``DatabaseUnavailable``/``FillsNotPersisted``."""
    connect_timeout_s: float = 5.0
    """Server databases: how long one connection attempt may take."""
