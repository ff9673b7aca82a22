"""Everything the system must remember: SQL ledger, model registry, learned floors, events.

``storage`` knows nothing of ``agent``. The public surface (re-exported here):

* :func:`open_database` -> :class:`Database` (checks or migrates the schema);
* repositories taking that ``Database``: :class:`Instruments`, :class:`Ledger`,
  :class:`ModelRegistry`, :class:`LearnedFloors`, :class:`Journal`;
* :class:`CheckpointStore` for checkpoint bytes;
* value types in :mod:`storage.records` and errors in :mod:`storage.errors`.
"""

from storage.checkpoints import CheckpointStore
from storage.config import StorageConfig
from storage.engine import Database
from storage.floors import LearnedFloors
from storage.instruments import Instruments
from storage.journal import Journal
from storage.ledger import Ledger, apply_fill
from storage.registry import ModelRegistry
from storage.schema import open_database

__all__ = [
    "CheckpointStore",
    "Database",
    "Instruments",
    "Journal",
    "LearnedFloors",
    "Ledger",
    "ModelRegistry",
    "StorageConfig",
    "apply_fill",
    "open_database",
]
