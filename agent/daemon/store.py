"""The daemon's access to SQL: every call on one dedicated worker thread.

The storage repositories block (SQLAlchemy, synchronous drivers), so the event loop hands
each call to a single-thread executor: calls run one at a time in submission order (fills are
recorded in the order they were received) and never stall the feed. ``DatabaseUnavailable``
(including ``FillsNotPersisted``) reaches the caller, which halts new orders and retries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from storage import CheckpointStore, Instruments, Journal, LearnedFloors, Ledger, ModelRegistry
from storage.engine import Database

__all__ = ["SqlWorker"]

P = ParamSpec("P")
T = TypeVar("T")


class SqlWorker:
    """The repositories of one database, used from the loop through :meth:`call`."""

    def __init__(self, database: Database, data_dir: str) -> None:
        self.database = database
        self.ledger = Ledger(database)
        self.journal = Journal(database)
        self.registry = ModelRegistry(database)
        self.floors = LearnedFloors(database)
        self.instruments = Instruments(database)
        self.checkpoints = CheckpointStore.for_data_dir(data_dir)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sql")

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the SQL thread and await its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.database.close()
