"""The daemon's access to SQL: every call on one dedicated worker thread, orders first.

The storage repositories block (SQLAlchemy, synchronous drivers), so the event loop hands each
call to one worker thread and never stalls the feed. One thread, because a second writer on
SQLite only waits for the lock (with the busy handler's millisecond sleeps); with priorities,
because the commit of an order bound for a gateway sits on the latency path (it precedes the
send): :meth:`SqlWorker.call_orders` runs before any queued :meth:`SqlWorker.call` (reports,
events, the rows of paper orders), so it waits for at most the transaction in progress. Calls
of one kind run in submission order (fills are recorded in the order they were received). No
report can overtake its order's row: a gateway order is committed before it is sent, and the
row of a paper order is queued, in the daemon's ordered write queue, before it is sent.
``DatabaseUnavailable`` (including ``FillsNotPersisted``) reaches the caller, which
halts new orders and retries.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from storage import CheckpointStore, Instruments, Journal, LearnedFloors, Leases, Ledger, ModelRegistry
from storage.database import Database

__all__ = ["SqlWorker"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

_ORDERS, _REPORTS, _STOP = 0, 1, 2


class SqlWorker:
    """The repositories of one database, used from the loop through :meth:`call`."""

    def __init__(self, database: Database, data_dir: str) -> None:
        self.database = database
        self.ledger = Ledger(database)
        self.journal = Journal(database)
        self.leases = Leases(database)
        self.registry = ModelRegistry(database)
        self.floors = LearnedFloors(database)
        self.instruments = Instruments(database)
        self.checkpoints = CheckpointStore.for_data_dir(data_dir)
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], Any] | None, Any]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._work, name="sql", daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the SQL thread (after any queued order commit)."""
        return await self._submit(_REPORTS, functools.partial(fn, *args, **kwargs))

    async def call_orders(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the SQL thread ahead of every queued :meth:`call`."""
        return await self._submit(_ORDERS, functools.partial(fn, *args, **kwargs))

    async def _submit(self, priority: int, work: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((priority, next(self._order), work, (loop, future)))
        return await future

    def _work(self) -> None:
        while True:
            _, _, work, target = self._queue.get()
            if work is None:
                return
            loop, future = target
            try:
                result = work()
            except BaseException as exc:
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish the queued calls (waiting at most ``timeout_s``), stop the thread and close
        the database. Calls still running after that are abandoned with the process."""
        self._queue.put((_STOP, next(self._order), None, None))
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("SQL calls still running after %.0f s at shutdown; abandoned", timeout_s)
            return
        self.database.close()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
