"""The trading daemon (``tradeagent run``): one asyncio process, DESIGN sections 3 and 11.

:class:`Daemon` composes the parts, each a module of :mod:`agent.daemon` with one concern::

    feed ──records──> paper venue (fills against the book)                         intake
      │──records──> incremental book/health/bars/features ──bar closes──> [bounded decision queue]
    decisions <──────────────────────────────────────────────────────────────┘      decisions
      │  the trading step (agent.trading.step), one batched decision per round of closed bars:
      │  regime scale (learned floor) x Kelly -> target -> risk clamp -> delta vs position+working
      ├──orders──> paper broker; their rows ──> [ledger write queue]                 placement
      └──orders──> ledger (record_orders, SQL thread) ──> ZMQ gateway (an external venue)
    venue ──reports──> [ledger write queue: in order, never dropped; spilled to disk     writes
                        past its bound (backlog)] ──> writes task
                         ──> ledger (record_orders, record_fills, update_order; SQL thread)
                         └─> order state + portfolio (after the commit)
    status tick: watchdog, stale-feed poll, ack timeouts, database probe,       supervision
                 flatten progress, gauges (and the risk guard after each round)
    control socket commands, model swaps                                           commands
    lock, database, leases, restart recovery                                       session
    counts and Prometheus (metrics), halts + events + telemetry (events), retrain scheduler

Every part with a task is a :class:`agent.daemon.lifecycle.Component` (NEW -> STARTING ->
RUNNING -> STOPPING -> STOPPED, or FAULTED), and so is the daemon: :meth:`Daemon.start` starts
the parts in order, registering each one's stop on one stack that the stop unwinds in reverse.

Guarantees:

* **Fills are never dropped** and reach the position only after the ledger committed them;
  a fill id seen twice counts once (the ledger is idempotent, the position follows its answer).
* **Orders in the ledger**: before they are sent to a gateway (they outlive this process);
  right behind them for the paper broker (they die with it), ahead of their reports in the one
  ordered write queue (see :mod:`agent.daemon.placement`).
* **Ledger writes wait, never dropped**, while the database refuses them (unavailable, or its
  disk full: a ``database`` halt whose reason names the cause and the path): in memory up to
  ``daemon.write_queue``, then in the spill file in ``daemon.spill_dir`` (all of them at once
  when the disk is full, so that a kill meanwhile loses none); they are persisted in order when
  the database accepts writes again, and the halt clears once all are (:mod:`agent.daemon.writes`).
* **Stale decisions are dropped and counted**: when the decision task falls behind, the queue
  keeps the newest ``daemon.decision_queue`` bar closes; a bar whose record arrived more than
  ``daemon.stale_decision_ms`` ago is still pushed through the model (windows stay complete)
  but sends no order (:mod:`agent.daemon.intake`, :mod:`agent.daemon.decisions`).
* **No order** while any halt is active (risk, operator, inference, database, venue, model),
  nor on an unhealthy instrument (the engine marks its row not valid).
* **SIGTERM**: stop intake, cancel resting orders, wait for their reports, persist, exit 0
  within ``daemon.stop_timeout_s``. Writes the database did not take by then are kept in the
  spill file (fsynced) and the exit code is 1, with a message naming the file; the next start
  persists them before it reads the ledger back and trades
  (:meth:`agent.daemon.writes.LedgerWrites.persist_kept`).
* **Restart**: positions and open orders are rebuilt from the ledger; in paper mode the orders
  of the previous process can no longer fill (its simulated exchange is gone) and are closed
  as cancelled; in gateway mode they stay open and the gateway's replay reconciles them
  (:meth:`agent.daemon.session.Session.recover`).
* **One daemon per data directory and ledger** (:mod:`agent.daemon.lock`,
  :mod:`agent.daemon.session`): the data directory's file lock is taken before the database or
  any socket is touched, and the session starts with the database leases of its instruments
  (renewed by a task; a lease another daemon took over stops this one with exit code 1). A
  second daemon is refused with exit code 2 naming the holder's pid and host; the session of a
  daemon that did not stop cleanly (SIGKILL, crash) is closed by the next start that takes its
  leases over.

What the daemon shows of itself: :meth:`Daemon.status` (a typed
:class:`agent.daemon.status.DaemonStatus`, what ``tradeagent ctl status`` prints), the read-only
properties below, the telemetry socket and the Prometheus endpoint.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import signal
import time
from dataclasses import dataclass

import zmq.asyncio
from threadpoolctl import threadpool_limits

from agent.config import Config
from agent.control.endpoints import ServerSockets, control_endpoint, telemetry_endpoint
from agent.control.server import ControlServer
from agent.daemon.backlog import Backlog, spill_path
from agent.daemon.commands import Commands
from agent.daemon.decisions import Decisions
from agent.daemon.events import Events
from agent.daemon.intake import DecisionQueue, Intake
from agent.daemon.lifecycle import Component
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.model_host import ModelHost
from agent.daemon.notify import Notifier
from agent.daemon.placement import Placement
from agent.daemon.scheduler import RetrainResult, RetrainScheduler, default_command
from agent.daemon.session import Session
from agent.daemon.status import DaemonStatus, Recovered
from agent.daemon.supervision import RiskGuard, Supervisor
from agent.daemon.telemetry import Telemetry
from agent.daemon.writes import LedgerWrites
from agent.errors import AgentError
from agent.execution.orders import OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import NewOrder, Side
from agent.execution.venues import GatewayVenue, PaperVenue, Venue
from agent.gpu.engine import InferenceEngine
from agent.trading.risk import Halts
from agent.trading.step import TradingStep
from feeds.features import IncrementalFeatures
from feeds.sources import build_source
from storage.values import instrument_set_key

__all__ = ["Daemon", "run_daemon"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Parts:
    """The parts built at start (the session, the books and the counts exist from the start)."""

    orders: OrderManager
    trading: TradingStep
    models: ModelHost
    writes: LedgerWrites
    placement: Placement
    intake: Intake
    guard: RiskGuard
    decisions: Decisions
    scheduler: RetrainScheduler


class Daemon(Component):
    """The whole trading process: :meth:`run` until :meth:`request_stop` (SIGTERM/SIGINT)."""

    def __init__(self, config: Config, *, config_path: str | None = None) -> None:
        super().__init__("daemon")
        if config.daemon.mode == "live" and config.broker.mode != "gateway":
            raise AgentError(
                'daemon.mode = "live" needs broker.mode = "gateway" (the paper broker is not live)'
            )
        specs = config.feeds.instruments
        if not specs:
            raise AgentError("feeds.instruments is empty: nothing to trade")
        self._config = config
        self._config_path = config_path
        self._specs = list(specs)
        self._symbols = {s.instrument_id: s.symbol for s in specs}
        self._account = config.broker.account
        self._metrics = DaemonMetrics()
        self._notifier = Notifier()
        self._halts = Halts()
        self._events = Events(self._halts, self._metrics)
        self._portfolio = Portfolio(self._specs)
        self._features = IncrementalFeatures(specs, config.feeds.bars, config.feeds.health)
        self._backlog = Backlog(
            spill_path(config.daemon, config.data_dir), config.daemon.write_queue, account=self._account
        )
        """Ledger writes in order: reports, and the rows of orders sent to the paper broker."""
        self._session = Session(
            config.daemon,
            config.storage,
            config.data_dir,
            self._specs,
            self._account,
            on_lost=self.request_stop,
        )
        self._parts: _Parts | None = None
        self._recovered: Recovered | None = None
        self._stack = contextlib.AsyncExitStack()
        self._stop_requested = asyncio.Event()
        self._exit_code = 0

    # -- what it shows ---------------------------------------------------------------------------

    def status(self) -> DaemonStatus:
        """What ``tradeagent ctl status`` prints."""
        cfg, parts = self._config, self._parts
        realised = self._portfolio.realised()
        equity = parts.trading.equity() if parts is not None else realised
        open_orders = parts.orders.open_orders() if parts is not None else []
        healthy = parts.decisions.healthy if parts is not None else dict.fromkeys(self._symbols, False)
        return DaemonStatus(
            state=self.state,
            mode=cfg.daemon.mode,
            broker=cfg.broker.mode,
            session_id=self._session.id,
            halts=dict(self._halts.active),
            flattening=parts is not None and parts.guard.flattening,
            model=parts.models.sha256 if parts is not None else "",
            positions=self._named_positions(),
            open_orders=len(open_orders),
            open_order_ids=[o.order.client_order_id for o in open_orders],
            realised_pnl=round(realised, 2),
            unrealised_pnl=round(equity - realised, 2),
            healthy={self._symbols[i]: ok for i, ok in healthy.items()},
            counts=dict(self._metrics.counts()),
            feed=parts.intake.source.counters.snapshot() if parts is not None else {},
            rejected_records=self._features.rejected,
            retrain_running=parts is not None and parts.scheduler.busy,
            recovered=self._recovered,
            ledger_backlog=self._backlog.describe(),
        )

    @property
    def counts(self) -> collections.Counter[str]:
        """Every count of ``ctl status`` now (a missing key reads 0)."""
        return self._metrics.counts()

    @property
    def records(self) -> int:
        """Records the source has delivered (``feed["records"]`` of :meth:`status`, read alone)."""
        return self._parts.intake.source.counters.records if self._parts is not None else 0

    @property
    def halts(self) -> dict[str, str]:
        """The active halts of new orders, kind -> reason."""
        return dict(self._halts.active)

    @property
    def positions(self) -> dict[int, int]:
        """Signed position per instrument id."""
        return self._portfolio.positions()

    @property
    def realised_pnl(self) -> float:
        return self._portfolio.realised()

    @property
    def engine(self) -> InferenceEngine | None:
        """The inference engine serving (None while no model does)."""
        return self._parts.models.engine if self._parts is not None else None

    def _named_positions(self) -> dict[str, int]:
        return {self._symbols[i]: q for i, q in self._portfolio.positions().items()}

    def _status_line(self) -> str:
        counts = self._metrics.counts()
        return f"{self.state}: {self._halts.describe()}; fills {counts['fills']}, orders {counts['orders']}"

    # -- what it does ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the orderly stop (signal handlers call this)."""
        self._stop_requested.set()

    async def run(self) -> int:
        """Start everything, trade until asked to stop, stop in order; the process exit code.

        BLAS runs on one thread: the decision batches are small matrices (fastest on one core)
        and the other cores stay free for the feed, the SQL thread and NATS.

        Once started, what the start-up made (modules, the model, the books: ~170,000 objects)
        is moved out of the garbage collector's reach (:func:`gc.freeze`): a full collection
        would walk it all, a pause of ~100 ms in the event loop, and with it only walks what
        was made since; the stop hands it back (:func:`gc.unfreeze`).
        """
        with threadpool_limits(limits=1):
            await self.start()
            gc.collect()
            gc.freeze()
            try:
                self._notifier.ready(self._status_line())
                log.info("daemon running: %s", self._status_line())
                await self._stop_requested.wait()
                await self.stop()
            finally:
                gc.unfreeze()
            return self._exit_code

    async def end_of_data(self) -> None:
        """Until the source reached the end of its data (a replay) and every ledger write it
        caused is committed and counted; the source's error if it failed."""
        parts = self._running()
        await parts.intake.fed()
        await parts.writes.drained()

    async def retrain(self) -> RetrainResult:
        """Run the retrain now, as the nightly schedule does (skipped while one runs)."""
        return await self._running().scheduler.trigger()

    def send_order(
        self, instrument_id: int, side: Side, qty: int, *, limit_price: int | None = None
    ) -> NewOrder:
        """Send one order outside the decisions, at the feed clock, through the path every order
        takes (its ledger row first or right behind it, then the venue; counted and published):
        a market order, or a limit order at ``limit_price`` (1e-9 fixed point). No risk limit or
        halt applies to it; the control socket does not offer it."""
        parts = self._running()
        order = parts.orders.new(
            instrument_id,
            side,
            qty,
            parts.intake.clock_ns,
            order_type="market" if limit_price is None else "limit",
            limit_price=limit_price,
            wall_ns=time.time_ns(),
        )
        parts.placement.place([order], [time.time_ns()])
        return order

    def _running(self) -> _Parts:
        if self._parts is None:
            raise AgentError(f"the daemon is {self.state}, not running")
        return self._parts

    # -- start and stop --------------------------------------------------------------------------

    async def _start(self) -> None:
        try:
            await self._compose()
        except BaseException:
            self._parts = None
            self._session.end_reason = "failed at start"
            await self._stack.aclose()
            self._backlog.close()
            raise

    # Long by nature: a linear composition, each part built from those before it, in start order.
    async def _compose(self) -> None:  # noqa: PLR0915
        """Build and start the parts in order; each one's release goes on the stack first."""
        cfg, stack, session = self._config, self._stack, self._session
        metrics, events, symbols = self._metrics, self._events, self._symbols
        stack.push_async_callback(session.stop)
        await session.start()  # the lock first, then the database and the leases
        sql = session.sql
        events.journal_to(sql, session.id)
        orders = OrderManager(f"s{session.id}")
        writes = LedgerWrites(
            backlog=self._backlog,
            sql=sql,
            orders=orders,
            portfolio=self._portfolio,
            metrics=metrics,
            events=events,
            config=cfg.daemon,
            symbols=symbols,
        )
        await writes.persist_kept()
        self._recovered = await session.recover(
            self._portfolio, orders, self._halts, metrics, symbols, paper=cfg.broker.mode == "paper"
        )
        floors = await session.regime_floors()
        ctx = zmq.asyncio.Context()
        stack.callback(ctx.destroy, linger=0)
        venue: Venue
        if cfg.broker.mode == "gateway":
            venue = GatewayVenue(ctx, cfg.broker, writes.on_report)
        else:
            venue = PaperVenue(cfg.broker, list(symbols), writes.on_report)
        placement = Placement(
            venue=venue,
            writes=writes,
            sql=sql,
            orders=orders,
            metrics=metrics,
            events=events,
            symbols=symbols,
            account=self._account,
            session_id=session.id,
        )
        trading = TradingStep(
            cfg,
            self._specs,
            floors,
            portfolio=self._portfolio,
            orders=orders,
            features=self._features,
            cancel=placement.cancel,
        )
        metrics.include(trading.status)
        models = ModelHost(
            sql.registry,
            sql.checkpoints,
            cfg.policy,
            [s.tick_value for s in self._specs],
            cfg.device,
            fee_per_contract=cfg.broker.fee_per_contract,
        )
        stack.callback(models.close)
        queue = DecisionQueue(cfg.daemon.decision_queue, metrics)
        intake = Intake(
            source=build_source(cfg.feeds),
            features=self._features,
            venue=venue,
            queue=queue,
            metrics=metrics,
            events=events,
            replay=cfg.feeds.source.kind == "replay",
            venue_latency_ns=int(cfg.broker.latency_ms * 1e6),
            settle=writes.drained,
            bar_interval_ns=round(cfg.feeds.bars.interval_s * 1e9) if cfg.feeds.bars.clock == "time" else 0,
            close_grace_ns=cfg.daemon.close_grace_ns,
        )
        guard = RiskGuard(trading, placement, intake, events)
        decisions = Decisions(
            queue=queue,
            intake=intake,
            trading=trading,
            models=models,
            placement=placement,
            guard=guard,
            metrics=metrics,
            events=events,
            config=cfg.daemon,
            scale_floor=cfg.policy.scale_floor,
            symbols=symbols,
        )
        supervisor = Supervisor(
            intake=intake,
            placement=placement,
            writes=writes,
            orders=orders,
            trading=trading,
            guard=guard,
            sql=sql,
            notifier=self._notifier,
            metrics=metrics,
            events=events,
            interval_s=cfg.daemon.status_interval_s,
            ack_timeout_s=cfg.broker.ack_timeout_s,
            session_id=session.id,
            symbols=symbols,
            status_line=self._status_line,
        )
        commands = Commands(
            status=self.status,
            guard=guard,
            models=models,
            sql=sql,
            metrics=metrics,
            events=events,
            instrument_set=instrument_set_key([s.symbol for s in self._specs]),
            session_id=session.id,
            stopping=self._stop_requested.is_set,
        )
        command = list(cfg.schedule.command) or default_command(self._config_path)
        scheduler = RetrainScheduler(cfg.schedule, command, commands.on_retrain)
        self._parts = _Parts(orders, trading, models, writes, placement, intake, guard, decisions, scheduler)

        await commands.serve_initial(cfg.daemon.checkpoint)
        servers = ServerSockets(ctx, cfg.control)
        stack.callback(servers.close)
        stack.push_async_callback(venue.close)
        await venue.start()
        telemetry = Telemetry(servers, telemetry_endpoint(cfg.control, cfg.data_dir))
        stack.callback(telemetry.close)
        events.attach(telemetry)
        control = ControlServer(servers, control_endpoint(cfg.control, cfg.data_dir), commands.handle)
        stack.push_async_callback(control.close)
        control.start()
        stack.callback(metrics.close)
        if cfg.control.metrics_port:
            metrics.serve(cfg.control.metrics_host, cfg.control.metrics_port)
        stack.push_async_callback(scheduler.stop)
        scheduler.start()
        stack.push_async_callback(events.drain)
        for part in (intake, decisions, writes, supervisor):
            stack.push_async_callback(part.stop)
            await part.start()
        trading.risk.start(trading.equity(), time.time_ns())

    async def _stop(self) -> None:
        """The orderly stop (:meth:`_shutdown`, bounded by ``daemon.stop_timeout_s``), then the
        parts released in reverse order; what the database did not take is kept in the spill
        file, before the releases' waits (a kill meanwhile loses nothing) and after them."""
        self._stop_requested.set()
        parts = self._parts
        if parts is None:  # a start that failed released everything already
            return
        try:
            await asyncio.wait_for(self._shutdown(parts), self._config.daemon.stop_timeout_s)
        except TimeoutError:
            log.error("orderly stop exceeded daemon.stop_timeout_s; exiting with what is persisted")
        parts.writes.keep(final=False)
        await self._stack.aclose()
        kept = parts.writes.keep(final=True)
        self._backlog.close()
        self._exit_code = 1 if self._session.lost or kept else 0

    async def _shutdown(self, parts: _Parts) -> None:
        """SIGTERM path: stop intake, cancel resting orders, persist (what the database has not
        taken by the deadline is kept in the spill file: :meth:`LedgerWrites.keep`)."""
        self._notifier.stopping()
        log.info("stopping: intake off, cancelling resting orders")
        await parts.intake.stop()
        await parts.decisions.stop()
        await parts.placement.sent()  # orders in flight leave first
        cancelled = parts.trading.cancel_all(parts.intake.clock_ns)
        if cancelled:
            log.info("cancel sent for %d open orders (shutdown)", cancelled)
        parts.placement.venue.advance(parts.intake.feed_now() + 10**10)
        deadline = time.monotonic() + self._config.daemon.stop_timeout_s / 2
        while (parts.orders.open_orders() or parts.writes.pending) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        while parts.writes.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def run_daemon(config: Config, config_path: str | None = None) -> int:
    """Run the daemon in this process with SIGTERM/SIGINT handling; returns the exit code."""

    async def main() -> int:
        daemon = Daemon(config, config_path=config_path)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.request_stop)
        return await daemon.run()

    return asyncio.run(main())
