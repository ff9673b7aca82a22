"""The trading daemon (``tradeagent run``): one asyncio process, DESIGN sections 3 and 11.

Tasks on one event loop::

    feed ──records──> paper venue (fills against the book)
      │──records──> incremental book/health/bars/features ──bar closes──> [bounded queue]
    decisions <──────────────────────────────────────────────────────────────┘
      │  the trading step (agent.trading.step), one batched decision per round of closed bars:
      │  regime scale (learned floor) x Kelly -> target -> risk clamp -> delta vs position+working
      ├──orders──> paper broker; their rows ──> [ledger write queue]
      └──orders──> ledger (record_orders, SQL thread) ──> ZMQ gateway (an external venue)
    venue ──reports──> [ledger write queue: in order, never dropped; spilled to disk past its
                        bound (agent.daemon.backlog)] ──> writes task
                         ──> ledger (record_orders, record_fills, update_order; SQL thread)
                         └─> order state + portfolio (after the commit)
    status tick: watchdog, stale-feed poll, ack timeouts, P&L breaker, metrics
    control socket, telemetry PUB, Prometheus, retrain scheduler

Guarantees:

* **Fills are never dropped** and reach the position only after the ledger committed them;
  a fill id seen twice counts once (the ledger is idempotent, the position follows its answer).
* **Orders in the ledger**: before they are sent to a gateway (they outlive this process);
  right behind them for the paper broker (they die with it), ahead of their reports in the one
  ordered write queue (see :meth:`Daemon._place`).
* **Ledger writes wait, never dropped**, while the database refuses them (unavailable, or its
  disk full: a ``database`` halt whose reason names the cause and the path): in memory up to
  ``daemon.write_queue``, then in the spill file in ``daemon.spill_dir`` (all of them at once
  when the disk is full, so that a kill meanwhile loses none); they are persisted in order when
  the database accepts writes again, and the halt clears once all are.
* **Stale decisions are dropped and counted**: when the decision task falls behind, the queue
  keeps the newest ``daemon.decision_queue`` bar closes; a bar whose record arrived more than
  ``daemon.stale_decision_ms`` ago is still pushed through the model (windows stay complete)
  but sends no order.
* **No order** while any halt is active (risk, operator, inference, database, venue, model),
  nor on an unhealthy instrument (the engine marks its row not valid).
* **SIGTERM**: stop intake, cancel resting orders, wait for their reports, persist, exit 0
  within ``daemon.stop_timeout_s``. Writes the database did not take by then are kept in the
  spill file (fsynced) and the exit code is 1, with a message naming the file; the next start
  persists them before it reads the ledger back and trades (see :meth:`Daemon._replay_kept`).
* **Restart**: positions and open orders are rebuilt from the ledger; in paper mode the orders
  of the previous process can no longer fill (its simulated exchange is gone) and are closed
  as cancelled; in gateway mode they stay open and the gateway's replay reconciles them.
* **One daemon per data directory and ledger** (:mod:`agent.daemon.lock`): the data
  directory's file lock is taken before the database or any socket is touched, and the
  session starts with the database leases of its instruments (renewed by a task; a lease
  another daemon took over stops this one with exit code 1). A second daemon is refused with
  exit code 2 naming the holder's pid and host; the session of a daemon that did not stop
  cleanly (SIGKILL, crash) is closed by the next start that takes its leases over.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import zmq.asyncio
from threadpoolctl import threadpool_limits

from agent.config import Config
from agent.control.endpoints import ServerSockets, control_endpoint, telemetry_endpoint
from agent.control.errors import ControlRefused
from agent.control.messages import ControlRequest
from agent.control.server import ControlServer
from agent.daemon.backlog import Backlog, Entry, OrderRows, SpillError, spill_path
from agent.daemon.lock import DaemonLock, holder_gone, lease_refused
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.models import ModelHost, ModelRefused
from agent.daemon.notify import Notifier
from agent.daemon.scheduler import RetrainResult, RetrainScheduler, default_command
from agent.daemon.store import SqlWorker
from agent.daemon.telemetry import Telemetry
from agent.errors import AgentError
from agent.execution.ledger_rows import ledger_fills, ledger_orders
from agent.execution.orders import OpenOrder, OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import Ack, Cancelled, CancelOrder, Fill, NewOrder, Reject, Report
from agent.execution.venues import GatewayVenue, PaperVenue, Venue
from agent.gpu.errors import InferenceError
from agent.policy.kelly import regime_clamp
from agent.trading.decider import EngineDecider
from agent.trading.risk import HaltKind, Halts
from agent.trading.step import BarClose, TradingStep, closing_runs
from agent.train.floors import VOL_REF_FLOOR
from feeds.dbn.framing import concat_mbp10
from feeds.features import BarFrame, IncrementalFeatures
from feeds.records import PRICE_SCALE
from feeds.sources import HealthEvent, HealthKind, RecordBatch, Source, SourceEvent, build_source
from storage.errors import DatabaseUnavailable, DiskFull, InvalidRecord, LeaseHeld, StorageError
from storage.records import InstrumentInfo, OrderStatus, instrument_set_key
from storage.schema import open_database

__all__ = ["Daemon", "run_daemon"]

log = logging.getLogger(__name__)

_STATUS: dict[type, OrderStatus] = {Ack: "acked", Cancelled: "cancelled", Reject: "rejected"}
_VERSION = "0.1.0"
_INTAKE_BATCHES = 64
"""Record batches a live feed's run waits for at most (one JetStream fetch by default)."""


@dataclass(slots=True)
class _Written:
    """Entries just persisted and taken off the write queue, to be applied."""

    entries: Sequence[Entry]
    inserted: frozenset[str] = frozenset()
    """Fill ids the ledger stored for the first time (the others were there already)."""


@dataclass(slots=True)
class _Close:
    """One bar close waiting for its decision."""

    frame: BarFrame
    arrival_ns: int
    """Wall clock (UNIX ns) when the batch holding the closing record was received."""


class Daemon:
    """The whole trading process; :meth:`run` until :meth:`request_stop` (SIGTERM/SIGINT)."""

    def __init__(self, config: Config, *, config_path: str | None = None) -> None:
        if config.daemon.mode == "live" and config.broker.mode != "gateway":
            raise AgentError(
                'daemon.mode = "live" needs broker.mode = "gateway" (the paper broker is not live)'
            )
        self.config = config
        self.config_path = config_path
        specs = config.feeds.instruments
        if not specs:
            raise AgentError("feeds.instruments is empty: nothing to trade")
        self.specs = list(specs)
        self.symbols = {s.instrument_id: s.symbol for s in specs}
        self.slot = {s.instrument_id: i for i, s in enumerate(specs)}
        self.instrument_set = instrument_set_key([s.symbol for s in specs])
        self.account = config.broker.account
        self.metrics = DaemonMetrics()
        self.notifier = Notifier()
        self.halts = Halts()
        self.portfolio = Portfolio(self.specs)
        self.features = IncrementalFeatures(specs, config.feeds.bars, config.feeds.health)
        self.orders = OrderManager("boot")
        self.session_id = 0
        self.latencies_ns: collections.deque[int] = collections.deque(maxlen=200_000)
        """Bar-closing record arrival -> order sent, per order (the ``bench daemon`` figures)."""
        self.decide_ns: collections.deque[int] = collections.deque(maxlen=200_000)
        """Duration of each batched ``decide`` call."""
        self.ledger_ns: collections.deque[int] = collections.deque(maxlen=200_000)
        """Duration of each order batch's ledger commit (before the orders leave)."""
        self.counts: collections.Counter[str] = collections.Counter()
        self.healthy: dict[int, bool] = dict.fromkeys(self.symbols, False)
        self.state = "starting"
        self.recovered: dict[str, Any] = {}
        """What the ledger gave back at start (positions, P&L, open orders)."""
        self._closes: collections.deque[_Close] = collections.deque()
        self._closes_ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._writes = Backlog(
            spill_path(config.daemon, config.data_dir), config.daemon.write_queue, account=self.account
        )
        """Ledger writes in order: reports, and the rows of orders sent to the paper broker."""
        self._writes_ready = asyncio.Event()
        self._drained = asyncio.Event()
        """Set when the write queue has been emptied (the replay waits on it)."""
        self._stop = asyncio.Event()
        self._intake_stopped = False
        self._flattening = False
        self._feed_ok = False
        self._feed_clock_ns = 0
        """Latest ``ts_recv`` seen (the feed's clock, UNIX ns)."""
        self._feed_wall_ns = 0
        """Wall clock when the feed clock last moved."""
        self._lock: DaemonLock | None = None
        self._lease_lost = False
        self._ctx: zmq.asyncio.Context | None = None
        self._servers: ServerSockets | None = None
        self._sql: SqlWorker | None = None
        self._models: ModelHost | None = None
        self._venue: Venue | None = None
        self._source: Source | None = None
        self._trading: TradingStep | None = None
        self._telemetry: Telemetry | None = None
        self._control: ControlServer | None = None
        self._scheduler: RetrainScheduler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._sending: set[asyncio.Task[None]] = set()
        self._probing = False

    # -- lifecycle -------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the orderly stop (signal handlers call this)."""
        self._stop.set()

    async def run(self) -> int:
        """Start everything, trade until asked to stop, stop in order; the process exit code.

        BLAS runs on one thread: the decision batches are small matrices (fastest on one core)
        and the other cores stay free for the feed, the SQL thread and NATS.
        """
        with threadpool_limits(limits=1):
            return await self._run()

    async def _run(self) -> int:
        try:
            await self._start()
        except BaseException:
            await self._teardown("failed at start")
            self._writes.close()
            raise
        self.notifier.ready(self._status_line())
        log.info("daemon running: %s", self._status_line())
        await self._stop.wait()
        try:
            await asyncio.wait_for(self._shutdown(), self.config.daemon.stop_timeout_s)
        except TimeoutError:
            log.error("orderly stop exceeded daemon.stop_timeout_s; exiting with what is persisted")
        self._keep_pending(final=False)  # on disk before the teardown's waits: a kill loses nothing
        await self._teardown("stopped")
        kept = self._keep_pending(final=True)
        self._writes.close()
        return 1 if self._lease_lost or kept else 0

    async def _start(self) -> None:
        cfg = self.config
        self._lock = DaemonLock.acquire(cfg.data_dir)  # before the database and any socket
        database = await asyncio.to_thread(open_database, cfg.storage, cfg.data_dir)
        self._sql = sql = SqlWorker(database, cfg.data_dir)
        infos = [
            InstrumentInfo(
                instrument_id=s.instrument_id, symbol=s.symbol, tick_size=s.tick_size, tick_value=s.tick_value
            )
            for s in self.specs
        ]
        await sql.call(sql.instruments.upsert, infos)
        self.session_id = await self._start_session(sql)
        self.orders = OrderManager(f"s{self.session_id}")
        await self._replay_kept()
        await self._recover()
        floors = await sql.call(sql.floors.all, VOL_REF_FLOOR)
        floor = [
            floors[(s.instrument_id, VOL_REF_FLOOR)].value
            if (s.instrument_id, VOL_REF_FLOOR) in floors
            else 0.0
            for s in self.specs
        ]
        self._trading = TradingStep(
            cfg,
            self.specs,
            floor,
            portfolio=self.portfolio,
            orders=self.orders,
            features=self.features,
            cancel=self._cancel,
        )
        self._models = ModelHost(
            sql.registry,
            sql.checkpoints,
            cfg.policy,
            [s.tick_value for s in self.specs],
            cfg.device,
            fee_per_contract=cfg.broker.fee_per_contract,
        )
        await self._load_initial_model()
        self._ctx = zmq.asyncio.Context()
        self._servers = ServerSockets(self._ctx, cfg.control)
        if cfg.broker.mode == "gateway":
            self._venue = GatewayVenue(self._ctx, cfg.broker, self._on_report)
        else:
            self._venue = PaperVenue(cfg.broker, list(self.symbols), self._on_report)
        await self._venue.start()
        self._telemetry = Telemetry(self._servers, telemetry_endpoint(cfg.control, cfg.data_dir))
        control = control_endpoint(cfg.control, cfg.data_dir)
        self._control = ControlServer(self._servers, control, self._handle)
        self._control.start()
        if cfg.control.metrics_port:
            self.metrics.serve(cfg.control.metrics_host, cfg.control.metrics_port)
        command = list(cfg.schedule.command) or default_command(self.config_path)
        self._scheduler = RetrainScheduler(cfg.schedule, command, self._on_retrain)
        self._scheduler.start()
        self._source = build_source(cfg.feeds)
        await self._source.start()
        self._feed_ok = True
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._feed(), name="feed"),
            loop.create_task(self._decisions(), name="decisions"),
            loop.create_task(self._process_writes(), name="writes"),
            loop.create_task(self._tick(), name="status"),
            loop.create_task(self._keep_lease(), name="lease"),
        ]
        self._trading.risk.start(self._equity(), time.time_ns())
        self.state = "running"

    async def _start_session(self, sql: SqlWorker) -> int:
        """Start this daemon's session with the leases of its instruments for its account
        (:mod:`storage.leases`): :class:`DaemonLocked` while another live daemon holds any;
        the sessions of daemons that did not stop cleanly are closed as their leases are taken."""
        try:
            leased = await sql.call(
                sql.leases.start_session,
                account=self.account,
                instrument_ids=list(self.symbols),
                mode=self.config.daemon.mode,
                host=socket.gethostname(),
                pid=os.getpid(),
                version=_VERSION,
                stale_after_s=self.config.daemon.lease_timeout_s,
                gone=holder_gone,
            )
        except LeaseHeld as exc:
            raise lease_refused(exc, self.config.daemon.lease_timeout_s) from None
        for lease in leased.taken_over:
            log.warning(
                "daemon session %d (pid %d on host %s) did not stop cleanly: closed, its leases taken over",
                lease.session_id,
                lease.pid,
                lease.host,
            )
        return leased.session_id

    async def _keep_lease(self) -> None:
        """Renew the leases every third of ``daemon.lease_timeout_s``; a failed renewal is tried
        again at the next period. Leases another daemon took over (this one went stale: the
        database unreachable, or the loop stalled, for longer than the timeout) stop this
        daemon with exit code 1: the other one trades the ledger now."""
        sql = self._sql
        assert sql is not None
        period = self.config.daemon.lease_timeout_s / 3
        while True:
            await asyncio.sleep(period)
            try:
                await sql.call(
                    sql.leases.renew, self.session_id, account=self.account, instrument_ids=list(self.symbols)
                )
            except LeaseHeld as exc:
                log.error("%s: another daemon trades this ledger now; stopping", exc)
                self._lease_lost = True
                self.request_stop()
                return
            except StorageError as exc:
                log.warning("daemon lease not renewed (%s); next attempt in %.1f s", exc, period)

    async def _replay_kept(self) -> None:
        """Before the ledger is read back: the writes a previous process kept in the spill file
        (:meth:`Backlog.adopt`) are persisted in order, as the writes task persists them
        (repeating one already stored changes nothing), and the file is removed once all are. A
        database that still refuses them stops the start; the file stays for the next one."""
        sql = self._sql
        assert sql is not None
        kept = self._writes.adopt(sql.database.display_url, database_file=sql.database.sqlite_path)
        if not kept:
            return
        log.warning("persisting the %d ledger writes a previous process kept in %s", kept, self._writes.path)
        try:
            while self._writes:
                await self._write_head()
        except StorageError as exc:
            raise AgentError(
                f"{self._writes.path}: {len(self._writes)} of the {kept} ledger writes kept there could "
                f"not be persisted ({exc}); the file stays: start again once the database accepts writes"
            ) from None
        log.info("the %d kept ledger writes are persisted", kept)

    async def _recover(self) -> None:
        """Rebuild positions and open orders from the ledger; restore a persisted halt."""
        sql = self._sql
        assert sql is not None
        state = await sql.call(sql.ledger.rebuild, self.account)
        for iid, pos in state.positions.items():
            if iid in self.slot:
                self.portfolio.restore(
                    iid, pos.qty, pos.avg_price * PRICE_SCALE, pos.realized_points * PRICE_SCALE, pos.fees
                )
        restored: list[OpenOrder] = []
        for rec in state.open_orders:
            if self.config.broker.mode == "paper":
                await sql.call(
                    sql.ledger.update_order,
                    rec.client_order_id,
                    "cancelled",
                    ts_ns=time.time_ns(),
                    reason="paper broker restarted",
                )
                self.counts["orders_closed_at_restart"] += 1
                continue
            order = NewOrder(
                client_order_id=rec.client_order_id,
                instrument_id=rec.instrument_id,
                side=rec.side,
                qty=rec.qty,
                order_type=rec.order_type,
                limit_price=rec.limit_price,
                ts_ns=rec.ts_created_ns,
            )
            restored.append(OpenOrder(order=order, filled=rec.filled_qty, acked=rec.status != "new"))
        self.orders.restore(restored)
        self.recovered = {
            "positions": self._named_positions(),
            "realised_pnl": round(self.portfolio.realised(), 2),
            "open_orders": len(restored),
            "closed_paper_orders": self.counts["orders_closed_at_restart"],
        }
        halt = await sql.call(_persisted_halt, sql)
        if halt is not None:
            kind, reason = halt
            self.halts.set(kind, f"{reason} (persisted; tradeagent ctl resume to clear)")
        log.info(
            "recovered from the ledger: positions %s, %d open orders, halts: %s",
            {self.symbols[i]: q for i, q in self.portfolio.positions().items() if q},
            len(restored),
            self.halts.describe(),
        )

    async def _load_initial_model(self) -> None:
        sql, models = self._sql, self._models
        assert sql is not None and models is not None
        sha = self.config.daemon.checkpoint
        if not sha:
            record = await sql.call(sql.registry.current_promoted, self.instrument_set)
            sha = record.sha256 if record is not None else ""
        if not sha:
            self.halts.set("model", f"no promoted checkpoint for {self.instrument_set}")
            log.warning("no promoted checkpoint for %s: no orders until one is promoted", self.instrument_set)
            return
        try:
            await models.activate(sha)
        except ModelRefused as exc:
            self.halts.set("model", str(exc))
            log.error("%s; no orders until a valid checkpoint is promoted", exc)
            return
        self.metrics.set_model(sha)

    async def _shutdown(self) -> None:
        """SIGTERM path: stop intake, cancel resting orders, persist (what the database has not
        taken by the deadline is kept in the spill file: :meth:`_keep_pending`)."""
        self.state = "stopping"
        self.notifier.stopping()
        log.info("stopping: intake off, cancelling resting orders")
        self._intake_stopped = True
        if self._source is not None:
            await self._source.stop()
        for task in self._tasks[:2]:  # feed and decisions
            task.cancel()
        await asyncio.gather(*self._tasks[:2], return_exceptions=True)
        await asyncio.gather(*self._sending, return_exceptions=True)  # orders in flight leave first
        self._cancel_all("shutdown")
        venue = self._venue
        if venue is not None:
            venue.advance(self._feed_now() + 10**10)
        deadline = time.monotonic() + self.config.daemon.stop_timeout_s / 2
        while (self.orders.open_orders() or self._writes) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        while self._writes and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def _keep_pending(self, *, final: bool) -> bool:
        """Stop path: the ledger writes still pending go to the spill file, fsynced (no file when
        none is), for the next start to persist; True when some are pending (exit code 1). The
        ``final`` call, after the teardown, says so in an error naming the file."""
        pending = len(self._writes)
        try:
            self._writes.keep()
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
                self._writes.path,
            )
        return pending > 0

    async def _teardown(self, reason: str) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._background:  # journal writes in flight: a short grace, then cancelled
            _, late = await asyncio.wait(set(self._background), timeout=2.0)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._scheduler is not None:
            await self._scheduler.stop()
        if self._source is not None:
            await self._source.stop()
        if self._control is not None:
            await self._control.close()
        if self._venue is not None:
            await self._venue.close()
        if self._telemetry is not None:
            self._telemetry.close()
        if self._servers is not None:
            self._servers.close()
        self.metrics.close()
        if self._models is not None:
            self._models.close()
        if self._sql is not None:
            if self.session_id:
                with contextlib.suppress(StorageError):
                    await self._sql.call(self._sql.leases.end_session, self.session_id, reason=reason)
            self._sql.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
        if self._lock is not None:
            self._lock.release()
        self.state = "stopped"

    # -- feed ----------------------------------------------------------------------------------

    async def _feed(self) -> None:
        source = self._source
        assert source is not None
        try:
            if self.config.feeds.source.kind == "replay":
                async for event in source:
                    if isinstance(event, HealthEvent):
                        self._on_health(event)
                    else:
                        await self._on_replay_batch(event)
            else:
                await self._live_feed(source)
            log.warning("%s: end of data", source.name)
            if self._venue is not None:
                # The book stands still after the last record: orders still on their way to the
                # paper book arrive and execute against it.
                self._venue.advance(self._feed_clock_ns + int(self.config.broker.latency_ms * 1e6) + 1)
        except Exception:
            self._feed_ok = False
            log.exception("market-data source failed; no new orders")
            self.halts.set("venue", "market data source failed")
            raise

    async def _live_feed(self, source: Source) -> None:
        """A live feed in coalesced runs: an intake task moves the source's events into an
        inbox; this task takes the events at its head as one run (:meth:`_next_run`) and pushes
        each stretch of consecutive record batches through the venue and the features as one
        array. A NATS message carries a few records, and the per-call costs of the book, bars,
        features and the paper broker are ~100 us: one call per message cannot keep up with
        10k records/s, one call per run can. Health events are handled in their place between
        runs."""
        inbox: collections.deque[SourceEvent] = collections.deque()
        ready = asyncio.Event()
        intake = asyncio.get_running_loop().create_task(_intake(source, inbox, ready), name="intake")
        try:
            while not (intake.done() and not inbox):
                await ready.wait()
                events = [inbox.popleft() for _ in range(await self._next_run(inbox, intake))]
                if not inbox:
                    ready.clear()
                run: list[RecordBatch] = []
                for event in events:
                    if isinstance(event, HealthEvent):
                        self._on_run(run)
                        run = []
                        self._on_health(event)
                    else:
                        run.append(event)
                self._on_run(run)
            intake.result()  # the source's failure, if it failed
        finally:
            intake.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await intake

    async def _next_run(self, inbox: collections.deque[SourceEvent], intake: asyncio.Task[None]) -> int:
        """How many events at the head of ``inbox`` form the next run.

        The intake moves one queued event per pass of the loop: the run waits while passes
        bring more (one transport read holds many messages), up to :data:`_INTAKE_BATCHES`
        events, or until the inbox holds a batch closing the bar of every instrument. A run
        that closes bars ends with the last batch that closes one: the batches behind it wait
        for the next run, processed once the decision task took the bars (one batched decision
        for the instruments whose bars closed together). Where a run ends never changes the
        bars."""
        pending: collections.Counter[int] = collections.Counter()
        closed: set[int] = set()
        scanned = closing = 0
        while True:
            for k in range(scanned, len(inbox)):
                event = inbox[k]
                if isinstance(event, RecordBatch) and (ids := self.features.closing(event.records, pending)):
                    closing = k + 1
                    closed.update(ids)
            scanned = len(inbox)
            if len(closed) == len(self.features.by_id) or scanned >= _INTAKE_BATCHES or intake.done():
                break
            await asyncio.sleep(0)
            if len(inbox) == scanned:
                break
        return closing or scanned

    def _on_run(self, run: list[RecordBatch]) -> None:
        """Consecutive record batches as one array; each bar they close is measured from the
        arrival of the batch holding the record that closed it (:func:`closing_arrivals`)."""
        if run:
            self.counts["feed_runs"] += 1
            if len(run) == 1:
                self._on_records(run[0].records, run[0].received_ns)
                return
            arrivals = np.repeat(
                np.array([b.received_ns for b in run], dtype=np.int64), [len(b.records) for b in run]
            )
            self._on_records(concat_mbp10([b.records for b in run]), arrivals)

    async def _on_replay_batch(self, batch: RecordBatch) -> None:
        """Replay runs on the feed's clock, as the event-driven backtest does
        (:func:`agent.trading.step.closing_runs`): the records up to one that closes bars reach
        the venue and the features, the ledger writes they caused are committed (their fills
        count in the position), then the bars are decided and their orders placed before the
        next record. A replayed day gives the backtest's decisions, orders and fills."""
        venue = self._venue
        assert venue is not None
        for run, frame in closing_runs(self.features, batch.records):
            self._feed_clock_ns = max(self._feed_clock_ns, int(run["ts_recv"][-1]))
            self._feed_wall_ns = time.time_ns()
            venue.on_records(run)
            if frame is None:
                continue
            await self._writes_drained()
            self._idle.clear()
            self._enqueue([frame], [time.time_ns()])
            await self._idle.wait()

    async def _writes_drained(self) -> None:
        """Until every queued ledger write is committed and applied."""
        while self._writes:
            self._drained.clear()
            await self._drained.wait()

    def _on_records(
        self, records: np.ndarray[Any, np.dtype[np.void]], arrival: int | np.ndarray[Any, np.dtype[np.int64]]
    ) -> bool:
        """Feed the venue and the features; True when bars closed (decisions are queued).
        ``arrival``: when ``records`` arrived (UNIX ns), or, where they came in several
        batches, when each record did."""
        self._feed_clock_ns = max(self._feed_clock_ns, int(records["ts_recv"][-1]))
        self._feed_wall_ns = time.time_ns()
        venue = self._venue
        assert venue is not None
        venue.on_records(records)
        frames = self.features.push_records(records)
        if frames:
            if isinstance(arrival, int):
                self._enqueue(frames, [arrival] * len(frames))
            else:
                self._enqueue(frames, closing_arrivals(records, arrival, frames))
        return bool(frames)

    def _enqueue(self, frames: list[BarFrame], arrivals_ns: list[int]) -> None:
        for frame, arrival_ns in zip(frames, arrivals_ns, strict=True):
            self._closes.append(_Close(frame, arrival_ns))
        limit = self.config.daemon.decision_queue
        while len(self._closes) > limit:
            self._closes.popleft()
            self.counts["dropped_decisions"] += 1
            self.metrics.drops.labels(kind="decision_queue").inc()
        self._closes_ready.set()

    def _on_health(self, event: HealthEvent) -> None:
        kind = event.kind
        if kind in (HealthKind.GAP, HealthKind.DISCONNECTED, HealthKind.DROPPED):
            for builder in self.features.by_id.values():
                builder.report_gap(event.at_ns)
        if kind is HealthKind.REJECTED:
            self.counts["rejected_messages"] += event.count or 1
            self.metrics.rejections.labels(kind="feed_bytes").inc(event.count or 1)
        else:
            self.counts[f"feed_{kind.value}"] += 1
            self.metrics.gaps.labels(kind=kind.value).inc()
        log.warning("feed %s: %s", kind.value, event.detail)
        if kind in (HealthKind.GAP, HealthKind.RECONNECTED, HealthKind.DISCONNECTED):
            self._event(kind.value, event.detail or kind.value, details={"count": event.count})

    # -- decisions -----------------------------------------------------------------------------

    async def _decisions(self) -> None:
        while True:
            await self._closes_ready.wait()
            self._closes_ready.clear()
            closes = list(self._closes)
            self._closes.clear()
            if closes:
                await self._decide(closes)
            if not self._closes:
                self._idle.set()

    async def _decide(self, closes: list[_Close]) -> None:
        """One ``decide`` per round: round r holds the r-th pending bar of every instrument."""
        rows: dict[int, list[tuple[int, int, _Close]]] = collections.defaultdict(list)
        for close in closes:
            for r in range(len(close.frame)):
                rows[close.frame.instrument_id].append((len(rows[close.frame.instrument_id]), r, close))
        rounds = max(len(v) for v in rows.values())
        for k in range(rounds):
            batch = [(iid, entries[k]) for iid, entries in rows.items() if k < len(entries)]
            last = {iid for iid, entries in rows.items() if len(entries) == k + 1}
            await self._decide_round(batch, last)
            self._check_risk()

    async def _decide_round(self, batch: list[tuple[int, tuple[int, int, _Close]]], last: set[int]) -> None:
        trading = self._trading
        assert trading is not None
        closes = [BarClose(close.frame, r) for _, (_, r, close) in batch]
        for c in closes:
            tradable = bool(c.frame.tradable[c.row])
            self.healthy[c.instrument_id] = tradable
            self.metrics.healthy.labels(instrument=self.symbols[c.instrument_id]).set(1 if tradable else 0)
        engine = self._models.engine if self._models is not None else None
        if engine is None:
            trading.track(closes)
            self.counts["bars_without_model"] += len(batch)
            return
        started = time.perf_counter_ns()
        try:
            step = trading.decide(closes, EngineDecider(engine))
        except InferenceError as exc:
            await self._inference_failed(exc)
            return
        self.decide_ns.append(time.perf_counter_ns() - started)
        decided = step.decided
        regime = regime_clamp(step.regime, self.config.policy.scale_floor)
        now = time.time_ns()
        stale_ns = int(self.config.daemon.stale_decision_ms * 1e6)
        blocked = bool(self.halts) or self._intake_stopped or self._flattening
        orders: list[NewOrder] = []
        arrivals: list[int] = []
        for j, (iid, (_, r, close)) in enumerate(batch):
            action = int(decided.action[j])
            self.counts["decisions"] += 1
            self.metrics.decisions.labels(
                instrument=self.symbols[iid], action=("short", "flat", "long")[action]
            ).inc()
            if iid not in last or not decided.valid[j]:
                continue
            if now - close.arrival_ns > stale_ns:
                self.counts["stale_decisions"] += 1
                self.metrics.drops.labels(kind="stale_decision").inc()
                continue
            order = trading.order_for(
                closes[j], int(decided.target[j]), now_ns=self._feed_clock_ns, blocked=blocked, wall_ns=now
            )
            if order is not None:
                orders.append(order)
                arrivals.append(close.arrival_ns)
            if self._telemetry is not None:
                self._telemetry.publish(
                    "decision",
                    {
                        "instrument": self.symbols[iid],
                        "ts_close": int(close.frame.ts_close[r]),
                        "action": action,
                        "target": int(decided.target[j]),
                        "size": float(decided.size[j]),
                        "regime": float(regime[j]),
                        "model": engine.model_sha256,
                    },
                )
        if orders:
            self._place(orders, arrivals)

    def _cancel(self, request: CancelOrder) -> None:
        """The trading step's way to cancel an order (limit orders, flatten, shutdown)."""
        if self._venue is not None:
            self._venue.cancel(request)

    def _place(self, orders: list[NewOrder], arrivals: list[int]) -> None:
        """Send new orders; their ledger rows are written first or right behind them,
        depending on whether the venue outlives this process.

        * An external venue (the gateway) keeps an order after this process dies, and after a
          restart replays its reports, which must find the order in the ledger: the rows are
          committed first, the orders sent after (a task beside the decision task, so the next
          decision does not wait for the commit; the orders already count as working).
        * The in-process paper broker dies with the process, and so does every order it holds:
          the orders leave now and their rows join the ledger write queue, ahead of every
          report of theirs (the broker produces none before :meth:`PaperVenue.submit`). The
          queue never drops an entry and retries while the database is unavailable (new orders
          halt meanwhile); fills still count only once committed. A process killed before the
          rows' commit loses orders that could not have been filled anywhere else, and none
          of their fills was counted: the restart rebuilds exactly what was counted.
        """
        venue = self._venue
        assert venue is not None
        if venue.external:
            self._spawn_send(orders, arrivals)
            return
        rows = ledger_orders(orders, account=self.account, session_id=self.session_id)
        self._writes.append(OrderRows(rows=tuple(rows), queued_ns=time.perf_counter_ns()))
        self._writes_ready.set()
        self._submit(orders, arrivals)

    async def _send(self, orders: list[NewOrder], arrivals: list[int]) -> None:
        """Record the orders in the ledger, then send them (external venues; never the other
        way round)."""
        sql = self._sql
        assert sql is not None
        rows = ledger_orders(orders, account=self.account, session_id=self.session_id)
        started = time.perf_counter_ns()
        try:
            await sql.call_orders(sql.ledger.record_orders, rows)
        except DatabaseUnavailable as exc:
            self._set_halt("database", f"orders not recorded: {exc}")
            for o in orders:  # never sent: they are not open anywhere
                self.orders.apply(
                    Reject(seq=0, client_order_id=o.client_order_id, reason="database", ts_ns=o.ts_ns)
                )
            return
        self.ledger_ns.append(time.perf_counter_ns() - started)
        self._submit(orders, arrivals)

    def _submit(self, orders: list[NewOrder], arrivals: list[int]) -> None:
        venue = self._venue
        assert venue is not None
        for order, arrival in zip(orders, arrivals, strict=True):
            venue.submit(order)
            sent = time.time_ns()
            self.latencies_ns.append(sent - arrival)
            self.metrics.decision_latency.observe((sent - arrival) / 1e9)
            self.metrics.orders.labels(instrument=self.symbols[order.instrument_id], side=order.side).inc()
            self.counts["orders"] += 1
            if self._telemetry is not None:
                self._telemetry.publish("order", order)

    async def _inference_failed(self, exc: InferenceError) -> None:
        self.counts["inference_failures"] += 1
        if self.config.daemon.cpu_fallback and self._models is not None:
            log.error("inference failed (%s); daemon.cpu_fallback = true: rebuilding on the CPU", exc)
            try:
                await asyncio.to_thread(self._models.fall_back_to_cpu)
            except AgentError as again:
                self._set_halt("inference", f"CPU fallback failed: {again}")
                return
            self._event("fallback", f"inference failed ({exc}); now on the CPU")
            return
        self._set_halt("inference", str(exc))
        self._event("halt", f"inference failure: {exc}", details={"kind": "inference"})

    # -- reports -------------------------------------------------------------------------------

    def _on_report(self, report: Report) -> None:
        """Venue sink: queue every report (never dropped); the writes task persists them."""
        if isinstance(report, Fill):
            self.counts["fills_received"] += 1
        self._writes.append(report)
        self._writes_ready.set()

    async def _process_writes(self) -> None:
        """The writes task: persist the head of the write queue, then apply it, in order.

        While the database refuses writes (any storage error but a refused record: unavailable,
        locked, its disk full) new orders halt (``database``, the reason names the cause), the
        entries wait (spilled to disk past ``daemon.write_queue``) and the head is retried every
        ``daemon.db_retry_s``; the halt clears once the whole backlog is persisted."""
        while True:
            await self._writes_ready.wait()
            self._writes_ready.clear()
            wrote = False
            while self._writes:
                try:
                    self._apply(await self._write_head())
                except (StorageError, SpillError) as exc:
                    if isinstance(exc, DiskFull):  # no quick recovery: on disk now, a kill loses nothing
                        self._writes.spill()
                    self._set_halt("database", self._backlog_reason(exc))
                    await asyncio.sleep(self.config.daemon.db_retry_s)
                    continue
                wrote = True
            if wrote and self.halts.clear("database"):
                log.info("database back, the ledger backlog is persisted: orders resume")
                self._event("resume", "database available again", details={"kind": "database"})
            self._drained.set()

    def _backlog_reason(self, exc: Exception) -> str:
        backlog = self._writes
        where = f", spilled to {backlog.path}" if backlog.spilling else ""
        return f"{exc}; {len(backlog)} ledger writes wait{where}"

    async def _write_head(self) -> _Written:
        """Persist the entries at the head of the write queue and take them off it (consecutive
        order rows in one transaction, consecutive fills in one). A record the ledger refuses
        (``InvalidRecord``: bad input, which no retry can mend) is logged, counted and taken
        off; any other storage error reaches the caller with the entries still queued."""
        sql = self._sql
        assert sql is not None
        head = self._writes.head()
        if isinstance(head, OrderRows):
            entries = _leading(self._writes, OrderRows)
            rows = [row for e in entries for row in e.rows]
            try:
                await sql.call(sql.ledger.record_orders, rows)
            except InvalidRecord as exc:
                log.error("%d orders not recorded: %s", len(rows), exc)
                self.counts["unrecorded_orders"] += len(rows)
            return self._taken(entries)
        if isinstance(head, Fill):
            return await self._write_fills(_leading(self._writes, Fill))
        if isinstance(head, Ack) and any(
            isinstance(r, Fill) and r.client_order_id == head.client_order_id for r in self._writes
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
            self.counts["unrecorded_reports"] += 1
        return self._taken([head])

    async def _write_fills(self, fills: list[Fill]) -> _Written:
        """Record consecutive fills in one transaction. A batch the ledger refuses is tried again
        with its first fill alone (the next call takes the rest): only a refused fill itself is
        dropped (logged, counted), each other one is committed and then counted."""
        sql = self._sql
        assert sql is not None
        try:
            result = await sql.call(sql.ledger.record_fills, ledger_fills(fills))
        except InvalidRecord as exc:
            if len(fills) > 1:
                return await self._write_fills(fills[:1])
            log.error("fill %s of order %s not recorded: %s", fills[0].fill_id, fills[0].client_order_id, exc)
            self.counts["unrecorded_fills"] += 1
            self._taken(fills)
            return _Written([])
        return self._taken(fills, frozenset(result.inserted))

    def _taken(self, entries: Sequence[Entry], inserted: frozenset[str] = frozenset()) -> _Written:
        """Take ``entries`` (persisted) off the head of the write queue."""
        for _ in entries:
            self._writes.popleft()
        return _Written(entries, inserted)

    def _apply(self, written: _Written) -> None:
        """Persisted entries count now: a fill newly stored reaches the order and the position
        (a fill id seen before counts once), a report the order's state."""
        done = time.perf_counter_ns()
        for entry in written.entries:
            if isinstance(entry, OrderRows):
                self.ledger_ns.append(done - entry.queued_ns)
            elif isinstance(entry, Fill):
                if entry.fill_id in written.inserted:
                    self._count_fill(entry)
                else:
                    self.counts["duplicate_fills"] += 1
            else:
                if isinstance(entry, Reject):
                    self.counts["rejects"] += 1
                    log.warning("order %s rejected: %s", entry.client_order_id, entry.reason)
                self.orders.apply(entry)

    def _count_fill(self, fill: Fill) -> None:
        """A fill the ledger has just committed: now the order and the position count it."""
        self.orders.apply(fill)
        self.portfolio.apply(fill)
        symbol = self.symbols.get(fill.instrument_id, str(fill.instrument_id))
        self.counts["fills"] += 1
        self.metrics.fills.labels(instrument=symbol).inc()
        self.metrics.filled_contracts.labels(instrument=symbol).inc(fill.qty)
        self.metrics.position.labels(instrument=symbol).set(self.portfolio.position(fill.instrument_id))
        if self._telemetry is not None:
            self._telemetry.publish("fill", fill)

    # -- status tick -----------------------------------------------------------------------------

    async def _tick(self) -> None:
        interval = self.config.daemon.status_interval_s
        watchdog = self.notifier.watchdog_interval_s
        period = min(interval, watchdog) if watchdog else interval
        live = self.config.feeds.source.kind != "replay"
        while True:
            await asyncio.sleep(period)
            now = time.time_ns()
            if live and self._feed_clock_ns:
                feed_now = self._feed_now()
                frames = self.features.poll(feed_now)
                if frames:
                    self._enqueue(frames, [now] * len(frames))
                if self._venue is not None:
                    self._venue.advance(feed_now)
            self._check_venue(now)
            if "database" in self.halts.active and not self._probing:
                self._probing = True
                self._spawn(self._check_database())
            self._pnl_metrics()
            if self._flattening:
                self._flatten_step()
            self._refresh_metrics()
            if self._feed_ok and not (self._tasks and self._tasks[0].done()):
                self.notifier.watchdog()
            self.notifier.status(self._status_line())

    async def _check_database(self) -> None:
        """Clear a ``database`` halt when the database answers again and no report waits (with
        reports waiting, their successful persistence clears it)."""
        sql = self._sql
        try:
            if sql is None or self._writes:
                return
            try:  # the probe is a write (reads may succeed while writes are locked out)
                await sql.call(
                    sql.journal.record_event,
                    "resume",
                    "database available again",
                    session_id=self.session_id,
                    details={"kind": "database"},
                )
            except StorageError:
                return
            if self.halts.clear("database"):
                log.info("database back: orders resume")
        finally:
            self._probing = False

    def _feed_now(self) -> int:
        """The feed clock extrapolated with the wall clock since the last record: equal to the
        wall clock for a live feed, and never ahead of a replayed (historical) feed's pace."""
        if not self._feed_clock_ns:
            return time.time_ns()
        return self._feed_clock_ns + max(0, time.time_ns() - self._feed_wall_ns)

    def _check_venue(self, now_ns: int) -> None:
        """A ``venue`` halt while the gateway's heartbeat is lost or an order has no answer past
        ``broker.ack_timeout_s``. An order whose report waits in the ledger write queue (the
        database slow or refusing writes) was answered: the venue is not at fault."""
        venue = self._venue
        if venue is None:
            return
        timeout_ns = int(self.config.broker.ack_timeout_s * 1e9)
        answered = self._writes.reported
        unacked = self.orders.unacked_since(now_ns - timeout_ns)
        late = [o for o in unacked if o.order.client_order_id not in answered]
        if not venue.healthy or late:
            why = "gateway heartbeat lost" if not venue.healthy else f"{len(late)} orders without ack"
            self._set_halt("venue", why)
        elif self.halts.clear("venue"):
            log.info("execution venue healthy again")

    def _pnl_metrics(self) -> None:
        equity = self._equity()
        self.metrics.pnl.labels(kind="realised").set(self.portfolio.realised())
        self.metrics.pnl.labels(kind="unrealised").set(equity - self.portfolio.realised())

    def _check_risk(self) -> None:
        """The end of every decision round, on the feed clock, as in the event-driven backtest
        (:meth:`agent.trading.step.TradingStep.check_risk`): a loss or drawdown breach latches a
        ``risk`` halt and starts the flatten; a flatten in progress takes its next step."""
        trading = self._trading
        assert trading is not None
        breach = trading.check_risk(self._feed_clock_ns, latched="risk" in self.halts.active)
        if breach:
            log.error("risk limit breached: %s; flattening and halting", breach)
            self._set_halt("risk", breach)
            self._event("halt", breach, details={"kind": "risk"})
            self._flattening = True
        if self._flattening:
            self._flatten_step()

    def _equity(self) -> float:
        return self._trading.equity() if self._trading is not None else self.portfolio.realised()

    def _refresh_metrics(self) -> None:
        self.metrics.halted.set(1 if self.halts else 0)
        for iid, symbol in self.symbols.items():
            self.metrics.position.labels(instrument=symbol).set(self.portfolio.position(iid))

    def _set_halt(self, kind: HaltKind, reason: str) -> None:
        if self.halts.set(kind, reason):
            log.error("new orders halted (%s): %s", kind, reason)
            self.metrics.halted.set(1)

    def _event(self, kind: str, message: str, *, details: dict[str, Any] | None = None) -> None:
        """Publish an event and journal it in the background: a slow or unavailable database
        never holds up the caller (a failed journal write is logged; the outage is handled by
        the ledger paths)."""
        if self._telemetry is not None:
            self._telemetry.publish("event", {"kind": kind, "message": message, **(details or {})})
        if self._sql is not None:
            self._spawn(self._journal(kind, message, details))

    async def _journal(self, kind: str, message: str, details: dict[str, Any] | None) -> None:
        sql = self._sql
        assert sql is not None
        try:
            await sql.call(
                sql.journal.record_event, kind, message, session_id=self.session_id, details=details
            )
        except StorageError as exc:
            log.warning("event %s not journaled: %s", kind, exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a tracked background task (awaited, bounded, at shutdown)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _spawn_send(self, orders: list[NewOrder], arrivals: list[int]) -> None:
        task = self._spawn(self._send(orders, arrivals))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    # -- orders maintenance --------------------------------------------------------------------

    def _cancel_all(self, why: str) -> int:
        if self._venue is None or self._trading is None:
            return 0
        sent = self._trading.cancel_all(self._feed_clock_ns)
        if sent:
            log.info("cancel sent for %d open orders (%s)", sent, why)
        return sent

    def _flatten_step(self) -> None:
        """Cancel open orders, then close each position with a market order; repeat until flat."""
        if self._venue is None or self._sql is None or self._trading is None:
            return
        orders = self._trading.flatten(self._feed_clock_ns, wall_ns=time.time_ns())
        if orders is None:
            self._flattening = False
            log.info("flat")
        elif orders:
            self._place(orders, [time.time_ns()] * len(orders))

    # -- control ---------------------------------------------------------------------------------

    async def _handle(self, request: ControlRequest) -> dict[str, Any]:
        command = request.command
        if command == "status":
            return self.status()
        who = request.origin or "a client that did not name itself"
        if command == "halt":
            reason = request.args.get("reason", "operator")
            log.warning("operator halt from %s: %s (no new orders until tradeagent ctl resume)", who, reason)
            self.halts.set("operator", reason)
            self._event("halt", reason, details={"kind": "operator", "by": who})
            return {"halted": True, "halts": dict(self.halts.active)}
        if command == "resume":
            cleared = self.halts.resume()
            log.warning(
                "operator resume from %s: cleared %s; now %s",
                who,
                ", ".join(cleared) or "no latched halt",
                self.halts.describe(),
            )
            self._event("resume", "operator resume", details={"cleared": cleared, "by": who})
            return {"cleared": cleared, "halts": dict(self.halts.active)}
        if command == "flatten":
            log.warning("operator flatten from %s: new orders halted, every position closed", who)
            self.halts.set("operator", "flatten")
            self._event("halt", "flatten", details={"kind": "operator", "by": who})
            self._flattening = True
            self._flatten_step()
            return {"flattening": True, "positions": self._named_positions()}
        if command in ("reload", "promote", "rollback"):
            log.info("operator %s from %s %s", command, who, request.args or "")
            return await self._model_command(request)
        raise ControlRefused(f"unknown command {command}")

    async def _model_command(self, request: ControlRequest) -> dict[str, Any]:
        sql, models = self._sql, self._models
        assert sql is not None and models is not None
        try:
            if request.command == "promote":
                sha = request.args.get("sha256", "")
                record = await sql.call(sql.registry.get, sha)
                try:  # verify before the registry says it is promoted
                    await asyncio.to_thread(models.fetch, sha)
                except ModelRefused as exc:
                    self._event("swap_refused", str(exc), details={"sha256": sha, "serving": models.sha256})
                    raise ControlRefused(f"{exc}; still serving {models.sha256[:12] or 'no model'}") from None
                if record.status == "candidate":
                    record = await sql.call(
                        sql.registry.promote, sha, by="tradeagent ctl", session_id=self.session_id
                    )
                elif record.status != "promoted":
                    raise ControlRefused(
                        f"checkpoint {sha[:12]} is {record.status}; only a candidate can be promoted"
                    )
            elif request.command == "rollback":
                reason = request.args.get("reason", "operator rollback")
                record = await sql.call(
                    sql.registry.rollback,
                    self.instrument_set,
                    by="tradeagent ctl",
                    reason=reason,
                    session_id=self.session_id,
                )
            else:
                current = await sql.call(sql.registry.current_promoted, self.instrument_set)
                if current is None:
                    raise ControlRefused(f"no promoted checkpoint for {self.instrument_set}")
                record = current
        except StorageError as exc:
            raise ControlRefused(str(exc)) from None
        return await self._swap(record.sha256)

    async def _swap(self, sha: str) -> dict[str, Any]:
        models = self._models
        assert models is not None
        previous = models.sha256
        try:
            changed = await models.activate(sha)
        except ModelRefused as exc:
            self._event("swap_refused", str(exc), details={"sha256": sha, "serving": previous})
            raise ControlRefused(f"{exc}; still serving {previous[:12] or 'no model'}") from None
        if changed:
            self.halts.clear("model")
            self.metrics.set_model(sha)
            self._event("swap", f"model {sha[:12]} serving", details={"sha256": sha, "previous": previous})
        return {"serving": sha, "previous": previous, "swapped": changed}

    def _on_retrain(self, result: RetrainResult) -> None:
        self.counts[f"retrain_{result.outcome}"] += 1
        if result.outcome == "ok" and not self._stop.is_set():
            self._spawn(self._reload_after_retrain())

    async def _reload_after_retrain(self) -> None:
        try:
            await self._handle(ControlRequest(command="reload", origin="the nightly retrain"))
        except ControlRefused as exc:
            log.info("after the retrain: %s", exc)

    # -- reporting -------------------------------------------------------------------------------

    def _named_positions(self) -> dict[str, int]:
        return {self.symbols[i]: q for i, q in self.portfolio.positions().items()}

    def _status_line(self) -> str:
        counts = self.counts
        return f"{self.state}: {self.halts.describe()}; fills {counts['fills']}, orders {counts['orders']}"

    def status(self) -> dict[str, Any]:
        """What ``tradeagent ctl status`` prints."""
        realised = self.portfolio.realised()
        source = self._source
        return {
            "state": self.state,
            "mode": self.config.daemon.mode,
            "broker": self.config.broker.mode,
            "session_id": self.session_id,
            "halts": dict(self.halts.active),
            "model": self._models.sha256 if self._models is not None else "",
            "positions": self._named_positions(),
            "open_orders": len(self.orders.open_orders()),
            "open_order_ids": [o.order.client_order_id for o in self.orders.open_orders()],
            "realised_pnl": round(realised, 2),
            "unrealised_pnl": round(self._equity() - realised, 2),
            "healthy": {self.symbols[i]: ok for i, ok in self.healthy.items()},
            "counts": {**self.counts, **(self._trading.status() if self._trading is not None else {})},
            "feed": source.counters.snapshot() if source is not None else {},
            "rejected_records": self.features.rejected,
            "retrain_running": bool(self._scheduler and self._scheduler.busy),
            "recovered": self.recovered,
            "ledger_backlog": self._writes.describe(),
        }


_E = TypeVar("_E", Fill, OrderRows)


def closing_arrivals(
    records: np.ndarray[Any, np.dtype[np.void]],
    arrivals: np.ndarray[Any, np.dtype[np.int64]],
    frames: list[BarFrame],
) -> list[int]:
    """Per frame, when the record that closed its last bar arrived: ``arrivals[k]`` of the
    instrument's first record in ``records`` stamped at or after the bar's close (the record
    past a time bar's boundary; for an event bar, or a record stamped exactly at the boundary,
    the same or an earlier record: never later, so the latency is never understated). A frame
    whose instrument has no such record here takes the first arrival."""
    ids = records["instrument_id"]
    ts = records["ts_recv"].astype(np.int64)
    out = []
    for frame in frames:
        mine = np.flatnonzero(ids == frame.instrument_id)
        stamps = np.maximum.accumulate(ts[mine])
        k = int(np.searchsorted(stamps, int(frame.ts_close[-1]), side="left"))
        out.append(int(arrivals[mine[k]]) if k < mine.size else int(arrivals[0]))
    return out


def _leading(queue: Backlog, kind: type[_E]) -> list[_E]:
    """The entries of type ``kind`` at the head of ``queue`` (in memory), up to the first of
    another type (persisted together, in one transaction)."""
    run: list[_E] = []
    for entry in queue:
        if not isinstance(entry, kind):
            break
        run.append(entry)
    return run


async def _intake(source: Source, inbox: collections.deque[SourceEvent], ready: asyncio.Event) -> None:
    """Move the source's events into ``inbox`` (see :meth:`Daemon._live_feed`)."""
    try:
        async for event in source:
            inbox.append(event)
            ready.set()
    finally:
        ready.set()


def _persisted_halt(sql: SqlWorker) -> tuple[HaltKind, str] | None:
    """The latched halt (risk or operator) left by the journal: the last such ``halt`` event
    not followed by an operator ``resume`` (a database recovery's ``resume`` does not count)."""
    events = []
    for kind in ("halt", "resume"):
        after = 0
        while page := sql.journal.events(kind=kind, after_id=after, limit=1000):
            events.extend(page)
            after = page[-1].id
    latched: tuple[HaltKind, str] | None = None
    for event in sorted(events, key=lambda e: e.id):
        halt_kind = (event.details or {}).get("kind")
        if event.kind == "halt" and halt_kind in ("risk", "operator"):
            latched = ("risk" if halt_kind == "risk" else "operator"), event.message
        elif event.kind == "resume" and halt_kind != "database":
            latched = None
    return latched


def run_daemon(config: Config, config_path: str | None = None) -> int:
    """Run the daemon in this process with SIGTERM/SIGINT handling; returns the exit code."""

    async def main() -> int:
        daemon = Daemon(config, config_path=config_path)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.request_stop)
        return await daemon.run()

    return asyncio.run(main())
