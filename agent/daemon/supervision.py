"""Supervision: the status tick (watchdog, probes, metrics) and the risk guard (loss limits,
flatten progress).

:class:`RiskGuard` runs at the end of every decision round, on the feed clock, as in the
event-driven backtest (:meth:`agent.trading.step.TradingStep.check_risk`): a daily-loss or
drawdown breach latches a ``risk`` halt (persisted through its journaled ``halt`` event) and
starts a flatten; a flatten (a breach, or ``tradeagent ctl flatten``) cancels the open orders,
then closes each position with a market order, one step per round and per tick until flat.

:class:`Supervisor` ticks every ``daemon.status_interval_s`` (more often under a systemd
watchdog: half its period):

* a live feed's stale checks (its bars close on the clock in the feed task, a grace after their
  boundary) and the paper book's clock (:meth:`agent.daemon.intake.Intake.poll`);
* the venue: a ``venue`` halt while the gateway's heartbeat is lost or an order has had no
  answer for ``broker.ack_timeout_s``, cleared when healthy again. An order whose report waits
  in the ledger write queue (the database slow or refusing writes) was answered: the venue is
  not at fault;
* the database: while a ``database`` halt is active and no write waits (with writes waiting,
  their persistence clears it), a probe write to the journal; the halt clears once it succeeds;
* the next flatten step, the P&L, position and halted gauges;
* ``WATCHDOG=1`` to systemd only while the feed task is alive, and ``STATUS=`` with the halts
  and counters (:class:`agent.daemon.notify.Notifier`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from agent.daemon.events import Events
from agent.daemon.intake import Intake
from agent.daemon.lifecycle import Component
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.notify import Notifier
from agent.daemon.placement import Placement
from agent.daemon.store import SqlWorker
from agent.daemon.writes import LedgerWrites
from agent.execution.orders import OrderManager
from agent.trading.step import TradingStep
from storage.errors import StorageError

__all__ = ["RiskGuard", "Supervisor"]

log = logging.getLogger(__name__)


class RiskGuard:
    """The loss limits after each decision round, and the flatten in progress."""

    def __init__(self, trading: TradingStep, placement: Placement, intake: Intake, events: Events) -> None:
        self._trading = trading
        self._placement = placement
        self._intake = intake
        self._events = events
        self.flattening = False
        """A flatten is closing the positions (no new orders from decisions meanwhile)."""

    def after_round(self, now_ns: int) -> None:
        """A loss or drawdown breach latches a ``risk`` halt and starts the flatten; a flatten in
        progress takes its next step. ``now_ns``: the round's time on the feed clock (its orders'
        time, :meth:`agent.daemon.intake.Intake.order_ns`)."""
        halts = self._events.halts
        breach = self._trading.check_risk(now_ns, latched="risk" in halts.active)
        if breach:
            log.error("risk limit breached: %s; flattening and halting", breach)
            self._events.halt("risk", breach)
            self._events.emit("halt", breach, details={"kind": "risk"})
            self.flattening = True
        if self.flattening:
            self.step(now_ns)

    def flatten(self) -> None:
        """Start a flatten (``tradeagent ctl flatten``) and take its first step."""
        self.flattening = True
        self.step()

    def step(self, now_ns: int | None = None) -> None:
        """Cancel open orders, then close each position with a market order; repeat until flat.
        ``now_ns``: the feed time of the orders (the feed clock when ``None``)."""
        at = self._intake.clock_ns if now_ns is None else now_ns
        orders = self._trading.flatten(at, wall_ns=time.time_ns())
        if orders is None:
            self.flattening = False
            log.info("flat")
        elif orders:
            self._placement.place(orders, [time.time_ns()] * len(orders))


class Supervisor(Component):
    """The status tick (see the module docstring)."""

    def __init__(
        self,
        *,
        intake: Intake,
        placement: Placement,
        writes: LedgerWrites,
        orders: OrderManager,
        trading: TradingStep,
        guard: RiskGuard,
        sql: SqlWorker,
        notifier: Notifier,
        metrics: DaemonMetrics,
        events: Events,
        interval_s: float,
        ack_timeout_s: float,
        session_id: int,
        symbols: Mapping[int, str],
        status_line: Callable[[], str],
    ) -> None:
        super().__init__("supervisor")
        self._intake = intake
        self._placement = placement
        self._writes = writes
        self._orders = orders
        self._trading = trading
        self._guard = guard
        self._sql = sql
        self._notifier = notifier
        self._metrics = metrics
        self._events = events
        watchdog = notifier.watchdog_interval_s
        self._period = min(interval_s, watchdog) if watchdog else interval_s
        self._ack_timeout_ns = int(ack_timeout_s * 1e9)
        self._session_id = session_id
        self._symbols = symbols
        self._status_line = status_line
        self._probing = False

    async def _start(self) -> None:
        self._task(self._run(), "status")

    async def _stop(self) -> None:
        await self._cancel_tasks()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            self._tick(time.time_ns())

    def _tick(self, now_ns: int) -> None:
        self._intake.poll()
        self._check_venue(now_ns)
        if "database" in self._events.halts.active and not self._probing:
            self._probing = True
            self._events.spawn(self._probe_database())
        portfolio = self._trading.portfolio
        realised = portfolio.realised()
        self._metrics.set_pnl(realised, self._trading.equity() - realised)
        if self._guard.flattening:
            self._guard.step()
        self._metrics.set_halted(bool(self._events.halts))
        for iid, symbol in self._symbols.items():
            self._metrics.set_position(symbol, portfolio.position(iid))
        if self._intake.alive:
            self._notifier.watchdog()
        self._notifier.status(self._status_line())

    def _check_venue(self, now_ns: int) -> None:
        venue = self._placement.venue
        unacked = self._orders.unacked_since(now_ns - self._ack_timeout_ns)
        late = [o for o in unacked if not self._writes.answered(o.order.client_order_id)]
        if not venue.healthy or late:
            why = "gateway heartbeat lost" if not venue.healthy else f"{len(late)} orders without ack"
            self._events.halt("venue", why)
        elif self._events.halts.clear("venue"):
            log.info("execution venue healthy again")

    async def _probe_database(self) -> None:
        """Clear a ``database`` halt when the database answers a write again and no ledger write
        waits (with writes waiting, their successful persistence clears it)."""
        sql = self._sql
        try:
            if self._writes.pending:
                return
            try:  # the probe is a write (reads may succeed while writes are locked out)
                await sql.call(
                    sql.journal.record_event,
                    "resume",
                    "database available again",
                    session_id=self._session_id,
                    details={"kind": "database"},
                )
            except StorageError:
                return
            if self._events.halts.clear("database"):
                log.info("database back: orders resume")
        finally:
            self._probing = False
