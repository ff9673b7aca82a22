"""The daemon's access to SQL: every call on one dedicated worker thread.

The storage repositories block (SQLAlchemy, synchronous drivers), so the event loop hands
each call to a single-thread executor and never stalls the feed. Two lanes, each one thread
with calls in submission order: ``orders`` (the commit that precedes an order leaving: on the
latency path, so it never queues behind report persistence) and ``reports`` (fills, order
updates, events: in the order they were received). An order's commit completes before the order
is sent, so no report of it can overtake it. ``DatabaseUnavailable`` (including
``FillsNotPersisted``) reaches the caller, which halts new orders and retries.
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
        self._orders_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sql-orders"
        )

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the reports lane and await its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def call_orders(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the orders lane and await its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._orders_pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._orders_pool.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        self.database.close()
