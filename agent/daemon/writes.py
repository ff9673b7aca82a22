"""The ordered ledger writes: the venue's reports and the paper orders' rows, persisted in order,
never dropped, and counted only once committed.

Every report of the venue (:meth:`LedgerWrites.on_report`, the venue's sink) and the rows of the
orders sent to the paper broker (:meth:`LedgerWrites.queue_orders`) enter one queue
(:class:`agent.daemon.backlog.Backlog`: bounded in memory, spilled to a file past the bound).
The writes task persists its head, consecutive order rows in one transaction and consecutive
fills in one, then applies what it persisted: a fill the ledger stored for the first time
reaches the order and the position (:meth:`agent.execution.portfolio.Portfolio.apply`), a fill id
seen before counts once (``duplicate_fills``), a report moves the order's state.

While the database refuses writes (any storage error but a refused record: unavailable, locked,
its disk full) new orders halt (``database``, the reason names the cause and where the writes
wait), the entries wait (all of them in the spill file at once when the disk is full: a kill
meanwhile loses none) and the head is retried every ``daemon.db_retry_s``; the halt clears once
the whole backlog is persisted. A record the ledger refuses (``InvalidRecord``: bad input that
no retry can mend) is logged, counted (``unrecorded_orders``, ``unrecorded_fills``,
``unrecorded_reports``) and taken off.

At a start, :meth:`LedgerWrites.persist_kept` persists what a previous process kept in the
spill file before the ledger is read back; at a stop, :meth:`LedgerWrites.keep` puts what the
database did not take in the spill file (fsynced) for the next start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from agent.daemon.backlog import Backlog, Entry, OrderRows, SpillError
from agent.daemon.config import DaemonConfig
from agent.daemon.events import Events
from agent.daemon.lifecycle import Component
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.store import SqlWorker
from agent.errors import AgentError
from agent.execution.ledger_rows import ledger_fills
from agent.execution.orders import OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import Ack, Cancelled, Fill, Reject, Report
from storage.errors import DiskFull, InvalidRecord, StorageError
from storage.values import LedgerOrder, OrderStatus

__all__ = ["LedgerWrites"]

log = logging.getLogger(__name__)

_STATUS: dict[type, OrderStatus] = {Ack: "acked", Cancelled: "cancelled", Reject: "rejected"}


@dataclass(slots=True)
class _Written:
    """Entries just persisted and taken off the write queue, to be applied."""

    entries: Sequence[Entry]
    inserted: frozenset[str] = frozenset()
    """Fill ids the ledger stored for the first time (the others were there already)."""


class LedgerWrites(Component):
    """The write queue and its task (see the module docstring)."""

    def __init__(
        self,
        *,
        backlog: Backlog,
        sql: SqlWorker,
        orders: OrderManager,
        portfolio: Portfolio,
        metrics: DaemonMetrics,
        events: Events,
        config: DaemonConfig,
        symbols: Mapping[int, str],
    ) -> None:
        super().__init__("ledger writes")
        self._backlog = backlog
        self._sql = sql
        self._orders = orders
        self._portfolio = portfolio
        self._metrics = metrics
        self._events = events
        self._retry_s = config.db_retry_s
        self._symbols = symbols
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        """Set when the queue has been emptied (:meth:`drained` waits on it)."""

    @property
    def pending(self) -> int:
        """Writes waiting (in memory and in the spill file)."""
        return len(self._backlog)

    def answered(self, client_order_id: str) -> bool:
        """A report of the order waits here: its venue answered it."""
        return client_order_id in self._backlog.reported

    def on_report(self, report: Report) -> None:
        """The venue's sink: queue every report (never dropped)."""
        if isinstance(report, Fill):
            self._metrics.count("fills_received")
        self._backlog.append(report)
        self._ready.set()

    def queue_orders(self, rows: Sequence[LedgerOrder]) -> None:
        """The rows of orders about to leave for the paper broker, ahead of their reports."""
        self._backlog.append(OrderRows(rows=tuple(rows)))
        self._ready.set()

    async def drained(self) -> None:
        """Until every queued write is committed and applied."""
        while self._backlog:
            self._drained.clear()
            await self._drained.wait()

    async def _start(self) -> None:
        self._task(self._run(), "writes")

    async def _stop(self) -> None:
        await self._cancel_tasks()

    async def _run(self) -> None:
        """Persist the head of the queue, then apply it, in order (see the module docstring)."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            wrote = False
            while self._backlog:
                try:
                    self._apply(await self._write_head())
                except (StorageError, SpillError) as exc:
                    if isinstance(exc, DiskFull):  # no quick recovery: on disk now, a kill loses nothing
                        self._backlog.spill()
                    self._events.halt("database", self._reason(exc))
                    await asyncio.sleep(self._retry_s)
                    continue
                wrote = True
            if wrote and self._events.halts.clear("database"):
                log.info("database back, the ledger backlog is persisted: orders resume")
                self._events.emit("resume", "database available again", details={"kind": "database"})
            self._drained.set()

    def _reason(self, exc: Exception) -> str:
        backlog = self._backlog
        where = f", spilled to {backlog.path}" if backlog.spilling else ""
        return f"{exc}; {len(backlog)} ledger writes wait{where}"

    async def _write_head(self) -> _Written:
        """Persist the entries at the head of the queue and take them off it. A record the
        ledger refuses is logged, counted and taken off; any other storage error reaches the
        caller with the entries still queued."""
        sql, backlog = self._sql, self._backlog
        head = backlog.head()
        if isinstance(head, OrderRows):
            entries = _leading(backlog, OrderRows)
            rows = [row for e in entries for row in e.rows]
            try:
                await sql.call(sql.ledger.record_orders, rows)
            except InvalidRecord as exc:
                log.error("%d orders not recorded: %s", len(rows), exc)
                self._metrics.count("unrecorded_orders", len(rows))
            return self._taken(entries)
        if isinstance(head, Fill):
            return await self._write_fills(_leading(backlog, Fill))
        if isinstance(head, Ack) and any(
            isinstance(r, Fill) and r.client_order_id == head.client_order_id for r in backlog
        ):
            # The fill right behind it records the order's state; the ack needs no transaction.
            return self._taken([head])
        status: OrderStatus = _STATUS[type(head)]
        reason = getattr(head, "reason", None)
        try:
            await sql.call(
                sql.ledger.update_order, head.client_order_id, status, ts_ns=head.ts_ns, reason=reason
            )
        except InvalidRecord as exc:
            log.error("report %s for %s not recorded: %s", type(head).__name__, head.client_order_id, exc)
            self._metrics.count("unrecorded_reports")
        return self._taken([head])

    async def _write_fills(self, fills: list[Fill]) -> _Written:
        """Record consecutive fills in one transaction. A batch the ledger refuses is tried again
        with its first fill alone (the next call takes the rest): only a refused fill itself is
        dropped (logged, counted), each other one is committed and then counted."""
        sql = self._sql
        try:
            result = await sql.call(sql.ledger.record_fills, ledger_fills(fills))
        except InvalidRecord as exc:
            if len(fills) > 1:
                return await self._write_fills(fills[:1])
            log.error("fill %s of order %s not recorded: %s", fills[0].fill_id, fills[0].client_order_id, exc)
            self._metrics.count("unrecorded_fills")
            self._taken(fills)
            return _Written([])
        return self._taken(fills, frozenset(result.inserted))

    def _taken(self, entries: Sequence[Entry], inserted: frozenset[str] = frozenset()) -> _Written:
        """Take ``entries`` (persisted) off the head of the queue."""
        for _ in entries:
            self._backlog.popleft()
        return _Written(entries, inserted)

    def _apply(self, written: _Written) -> None:
        """Persisted entries count now: a fill newly stored reaches the order and the position
        (a fill id seen before counts once), a report the order's state."""
        for entry in written.entries:
            if isinstance(entry, OrderRows):
                continue
            if isinstance(entry, Fill):
                if entry.fill_id in written.inserted:
                    self._count_fill(entry)
                else:
                    self._metrics.count("duplicate_fills")
                continue
            if isinstance(entry, Reject):
                self._metrics.count("rejects")
                log.warning("order %s rejected: %s", entry.client_order_id, entry.reason)
            self._orders.apply(entry)

    def _count_fill(self, fill: Fill) -> None:
        """A fill the ledger has just committed: now the order and the position count it."""
        self._orders.apply(fill)
        self._portfolio.apply(fill)
        symbol = self._symbols.get(fill.instrument_id, str(fill.instrument_id))
        self._metrics.fill(symbol, fill.qty, self._portfolio.position(fill.instrument_id))
        self._events.publish("fill", fill)

    # -- start and stop --------------------------------------------------------------------------

    async def persist_kept(self) -> None:
        """Before the ledger is read back: the writes a previous process kept in the spill file
        (:meth:`Backlog.adopt`) are persisted in order, as the writes task persists them
        (repeating one already stored changes nothing), and the file is removed once all are. A
        database that still refuses them stops the start; the file stays for the next one."""
        backlog, database = self._backlog, self._sql.database
        kept = backlog.adopt(database.display_url, database_file=database.sqlite_path)
        if not kept:
            return
        log.warning("persisting the %d ledger writes a previous process kept in %s", kept, backlog.path)
        try:
            while backlog:
                await self._write_head()
        except StorageError as exc:
            raise AgentError(
                f"{backlog.path}: {len(backlog)} of the {kept} ledger writes kept there could "
                f"not be persisted ({exc}); the file stays: start again once the database accepts writes"
            ) from None
        log.info("the %d kept ledger writes are persisted", kept)

    def keep(self, *, final: bool) -> bool:
        """Stop path: the writes still pending go to the spill file, fsynced (no file when none
        is), for the next start to persist; True when some are pending (exit code 1). The
        ``final`` call, after the teardown, says so in an error naming the file."""
        backlog = self._backlog
        pending = len(backlog)
        try:
            backlog.keep()
        except SpillError as exc:
            if final:
                log.critical(
                    "%d ledger writes could be neither persisted nor kept in the spill file (%s): "
                    "they are lost with this process; make room in daemon.spill_dir, best on "
                    "another disk than the database",
                    pending,
                    exc,
                )
            else:
                log.error(
                    "%d ledger writes not in the spill file yet (%s): retried after the teardown",
                    pending,
                    exc,
                )
            return True
        if final and pending:
            log.error(
                "%d ledger writes could not be persisted before the stop deadline: kept in %s; "
                "the next start persists them before trading",
                pending,
                backlog.path,
            )
        return pending > 0


_E = TypeVar("_E", Fill, OrderRows)


def _leading(queue: Backlog, kind: type[_E]) -> list[_E]:
    """The entries of type ``kind`` at the head of ``queue`` (in memory), up to the first of
    another type (persisted together, in one transaction)."""
    run: list[_E] = []
    for entry in queue:
        if not isinstance(entry, kind):
            break
        run.append(entry)
    return run
