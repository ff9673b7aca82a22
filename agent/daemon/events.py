"""How the daemon's parts tell the world what happened: halts, events and short background work.

* :meth:`Events.halt` raises a halt of new orders (logged once when new, the ``tradeagent_halted``
  gauge set at once);
* :meth:`Events.emit` publishes an event on the telemetry socket (topic ``event``) and journals
  it in the database in the background: a slow or unavailable database never holds up the part
  that reported it (a failed journal write is logged; the outage itself is handled by the
  ledger writes, :mod:`agent.daemon.writes`);
* :meth:`Events.publish` puts a decision, an order or a fill on the telemetry socket;
* :meth:`Events.spawn` runs short work beside the parts' own tasks (journal writes, the database
  probe, a gateway order's commit-then-send, the reload after a retrain); the stop gives it a
  short grace, then cancels what is left (:meth:`Events.drain`).

The telemetry socket and the journal are attached once the daemon has them
(:meth:`Events.attach`, :meth:`Events.journal_to`); until then nothing is published or journaled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import msgspec

from agent.daemon.metrics import DaemonMetrics
from agent.daemon.store import SqlWorker
from agent.daemon.telemetry import Telemetry
from agent.trading.risk import HaltKind, Halts
from storage.errors import StorageError

__all__ = ["Events"]

log = logging.getLogger(__name__)

_GRACE_S = 2.0
"""How long the stop waits for background work before cancelling it."""


class Events:
    """Halts, the event journal, telemetry and background work of one daemon."""

    def __init__(self, halts: Halts, metrics: DaemonMetrics) -> None:
        self.halts = halts
        self._metrics = metrics
        self._telemetry: Telemetry | None = None
        self._sql: SqlWorker | None = None
        self._session_id = 0
        self._background: set[asyncio.Task[None]] = set()

    def attach(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    def journal_to(self, sql: SqlWorker, session_id: int) -> None:
        self._sql = sql
        self._session_id = session_id

    def halt(self, kind: HaltKind, reason: str) -> None:
        """Halt new orders for ``kind`` (logged when it was not active yet)."""
        if self.halts.set(kind, reason):
            log.error("new orders halted (%s): %s", kind, reason)
            self._metrics.set_halted(True)

    def publish(self, topic: str, payload: msgspec.Struct | dict[str, Any]) -> None:
        if self._telemetry is not None:
            self._telemetry.publish(topic, payload)

    def emit(self, kind: str, message: str, *, details: dict[str, Any] | None = None) -> None:
        """Publish an event and journal it in the background."""
        self.publish("event", {"kind": kind, "message": message, **(details or {})})
        if self._sql is not None:
            self.spawn(self._journal(self._sql, kind, message, details))

    async def _journal(self, sql: SqlWorker, kind: str, message: str, details: dict[str, Any] | None) -> None:
        try:
            await sql.call(
                sql.journal.record_event, kind, message, session_id=self._session_id, details=details
            )
        except StorageError as exc:
            log.warning("event %s not journaled: %s", kind, exc)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as tracked background work (given a grace at the stop)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain(self) -> None:
        """The stop: background work in flight gets a short grace, then is cancelled."""
        if not self._background:
            return
        _, late = await asyncio.wait(set(self._background), timeout=_GRACE_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
