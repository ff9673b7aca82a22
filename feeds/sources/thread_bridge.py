"""Hand record bytes produced on another thread to an asyncio loop, in batches.

Databento's live client calls back on its own thread, once per record. Scheduling one loop
callback per record would cost more than the records themselves, so :class:`ThreadBridge`
appends raw record bytes to a list under a lock and schedules a single drain on the loop when
the list goes from empty to non-empty: whatever accumulated meanwhile is delivered as one chunk.
The pending list is bounded (``max_pending_records``); beyond it records are dropped on the
producer thread and the count is delivered with the next drain, so a stalled loop can never
grow memory without bound. Control calls (:meth:`ThreadBridge.call`: a reconnect, a symbol
mapping) travel in the same list, so the loop sees them in their order relative to the records.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["ThreadBridge"]

DrainCallback = Callable[[bytes, int, int], None]
"""``(joined record bytes, records in them, records dropped since the last drain)``, on the loop."""


class ThreadBridge:
    """Thread-safe producer side, loop-side consumer callback (see the module docstring)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_drain: DrainCallback, max_pending_records: int
    ) -> None:
        if max_pending_records < 1:
            raise ValueError("max_pending_records must be >= 1")
        self._loop = loop
        self._on_drain = on_drain
        self._max = max_pending_records
        self._lock = threading.Lock()
        self._pending: list[bytes | Callable[[], None]] = []
        self._pending_records = 0
        self._dropped = 0
        self._scheduled = False
        self.closed = False

    def put(self, raw: bytes) -> None:
        """Queue one record's bytes (any thread)."""
        with self._lock:
            if self.closed:
                return
            if self._pending_records >= self._max:
                self._dropped += 1
            else:
                self._pending.append(raw)
                self._pending_records += 1
            self._schedule_locked()

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop after the records queued before it (any thread)."""
        with self._lock:
            if self.closed:
                return
            self._pending.append(fn)
            self._schedule_locked()

    def _schedule_locked(self) -> None:
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # loop closed: the source is gone
            self.closed = True

    def close(self) -> None:
        """Stop accepting records (pending ones are discarded)."""
        with self._lock:
            self.closed = True
            self._pending.clear()
            self._pending_records = 0

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._pending_records = 0
            dropped, self._dropped = self._dropped, 0
            self._scheduled = False
        run: list[bytes] = []
        for item in pending:
            if isinstance(item, bytes):
                run.append(item)
                continue
            if run or dropped:
                self._on_drain(b"".join(run), len(run), dropped)
                run, dropped = [], 0
            item()
        if run or dropped:
            self._on_drain(b"".join(run), len(run), dropped)
