"""Everything the system must remember: SQL ledger, model registry, learned floors, events.

``storage`` knows nothing of ``agent``. The public surface (re-exported here):

* :func:`open_database` -> :class:`Database` (checks or migrates the schema);
* repositories taking that ``Database``: :class:`Instruments`, :class:`Ledger`,
  :class:`ModelRegistry`, :class:`LearnedFloors`, :class:`Journal`, :class:`Leases`;
* :class:`CheckpointStore` for checkpoint bytes;
* value types in :mod:`storage.values` and errors in :mod:`storage.errors`.

The names are resolved on first use (PEP 562), so that ``import storage.config`` (which every
CLI command does through ``agent.config``) does not pay for importing SQLAlchemy and Alembic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.checkpoints import CheckpointStore
    from storage.config import StorageConfig
    from storage.database import Database
    from storage.floors import LearnedFloors
    from storage.instruments import Instruments
    from storage.journal import Journal
    from storage.leases import Leases
    from storage.ledger import Ledger, apply_fill
    from storage.registry import ModelRegistry
    from storage.schema import open_database

__all__ = [
    "CheckpointStore",
    "Database",
    "Instruments",
    "Journal",
    "LearnedFloors",
    "Leases",
    "Ledger",
    "ModelRegistry",
    "StorageConfig",
    "apply_fill",
    "open_database",
]

_HOME = {
    "CheckpointStore": "storage.checkpoints",
    "Database": "storage.database",
    "Instruments": "storage.instruments",
    "Journal": "storage.journal",
    "LearnedFloors": "storage.floors",
    "Leases": "storage.leases",
    "Ledger": "storage.ledger",
    "ModelRegistry": "storage.registry",
    "StorageConfig": "storage.config",
    "apply_fill": "storage.ledger",
    "open_database": "storage.schema",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
