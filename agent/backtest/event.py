"""The event-driven backtest driver: the daemon's pipeline on a simulated clock.

The recorded feed is replayed as fast as possible by the daemon's own source
(:class:`feeds.sources.ReplaySource`, pace 0) and every record goes through the same components,
in the same order, as in ``tradeagent run``: the incremental book/health/bar/feature builder
(:class:`feeds.features.IncrementalFeatures`), the daemon's trading step
(:class:`agent.trading.step.TradingStep`: the regime tracker with the learned floors, the
batched inference engine with ``policy.selection`` + Kelly x regime, the hard risk limits:
position clamp, order rate on the feed clock, daily loss and drawdown breach = flatten and
halt, checked after every decision round), the order manager, the paper broker
(:class:`agent.execution.broker.PaperBroker`: latency on the feed clock, book walk, IOC
remainder, fees) and the SQL ledger in a throwaway SQLite database: every order, fill, cancel
and reject is written in its order, one transaction per replayed batch of records (the daemon
commits each before it counts; here a failure ends the whole run, so nothing counted can be
missing from a ledger that is read back).

Clock: the feed's ``ts_recv``. A bar is decided when the daemon's intake would close it
(:func:`feeds.bars.decision_times`): when a record past its end arrives, once that record has
reached the book, or, for a time bar whose instrument is quiet for ``daemon.close_grace_ms``
past its end, on the clock at that moment, after the records stamped before it. The order
placed then executes against the book as it stands ``broker.latency_ms`` later (the paper
broker's rule).
Recorded gaps and stale stretches are replayed as they are: the health rules mark the bars not
tradable, and no order is sent on them.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent import __version__
from agent.backtest.books import DecisionLog
from agent.backtest.fast import FillList
from agent.config import Config
from agent.execution.broker import PaperBroker
from agent.execution.ledger_rows import ledger_fills, ledger_orders
from agent.execution.orders import OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import Cancelled, Fill, NewOrder, Reject, Report
from agent.trading.decider import Decided, Decider
from agent.trading.step import Step, TradingStep, decision_rounds
from feeds.bars import clock_closes
from feeds.config import InstrumentSpec
from feeds.features import FEATURE_NAMES, BarFrame, IncrementalFeatures
from feeds.records import MBP10_DTYPE, PRICE_SCALE
from feeds.sources import HealthEvent, HealthKind, ReplaySource
from storage.database import Database
from storage.instruments import Instruments
from storage.journal import Journal
from storage.ledger import Ledger, LedgerWrite, OrderUpdate
from storage.values import InstrumentInfo

__all__ = ["EventDriver", "EventRun"]

_LOGRET = FEATURE_NAMES.index("mid_logret")
_RECORD = MBP10_DTYPE.itemsize
ACCOUNT = "backtest"
REPLAY_BATCH = 8192
"""Records a batch of the replay: the ledger's transaction, the decision log's and the bars'
unit (:meth:`EventDriver._flush`)."""


class EventRun:
    """What one event-driven run produced."""

    def __init__(self) -> None:
        self.log = DecisionLog()
        self.fills = FillList.empty()
        self.frames: dict[str, list[BarFrame]] = {}
        """Per symbol: the bars closed, one frame per replayed batch of records."""
        self.latency_ns: list[int] = []
        """Per decision: closing record handed to the pipeline -> decision taken (order sent)."""
        self.records = 0
        self.counts: dict[str, int] = {}
        self.halt_reason = ""
        self.halt_ns: int | None = None
        """Feed time of the risk halt (None when none latched)."""
        self.ledger_pnl = 0.0
        """Realised + unrealised (last marks) - fees, rebuilt from the ledger's fills."""


class EventDriver:
    """One replay of ``path`` (records with ``start_ns <= ts_recv < end_ns``) through the pipeline.

    ``database`` is the throwaway ledger (already migrated); ``decider`` serves one slot per
    instrument in ``specs`` order.
    """

    def __init__(
        self,
        config: Config,
        specs: Sequence[InstrumentSpec],
        decider: Decider,
        database: Database,
        floors: Sequence[float],
        *,
        on_records: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.specs = list(specs)
        self.decider = decider
        self.slot = {s.instrument_id: i for i, s in enumerate(specs)}
        self.features = IncrementalFeatures(specs, config.feeds.bars, config.feeds.health)
        self.orders = OrderManager("bt")
        self.broker = PaperBroker(config.broker, list(self.slot))
        self.portfolio = Portfolio(self.specs)
        self.trading = TradingStep(
            config,
            specs,
            floors,
            portfolio=self.portfolio,
            orders=self.orders,
            features=self.features,
            cancel=lambda request: self._reports(self.broker.cancel(request)),
        )
        self.ledger = Ledger(database)
        self._writes: list[LedgerWrite] = []
        """Ledger writes of the batch of records being replayed (:meth:`_flush`)."""
        self._rows: list[tuple[int, int, int, bool, int]] = []
        """Decision log rows of the batch (:meth:`_flush`): time, instrument, bar, ordered, and
        when the bar was decided (its clock close is counted from it there)."""
        self._steps: list[Step] = []
        """The batch's steps, whose rows are :attr:`_rows` in order (:meth:`_flush`)."""
        self._frames: dict[str, list[BarFrame]] = {s.symbol: [] for s in specs}
        """The batch's frames per symbol (one per run of closes), joined into one at
        :meth:`_flush`: kept one by one, a run's 14 small views cost ~2.4 KB a bar."""
        self.database = database
        self.bars_seen = [0] * len(specs)
        self.order_bar: dict[str, tuple[int, int]] = {}
        self.halted = False
        self.session_id = 0
        self.run = EventRun()
        self.run.frames = {s.symbol: [] for s in specs}
        self._on_records = on_records
        self._counts: dict[str, int] = {"clock_close_bars": 0}
        """Counters of the run; ``clock_close_bars``: the bars closed on the clock
        (:func:`feeds.bars.clock_closes`)."""

    def _count(self, key: str, n: int = 1) -> None:
        self._counts[key] = self._counts.get(key, 0) + n

    async def replay(self, path: str | Path, start_ns: int, end_ns: int) -> EventRun:
        """Run the whole window; returns the run (the ledger is left in the database)."""
        Instruments(self.database).upsert(
            [
                InstrumentInfo(
                    instrument_id=s.instrument_id,
                    symbol=s.symbol,
                    tick_size=s.tick_size,
                    tick_value=s.tick_value,
                )
                for s in self.specs
            ]
        )
        session = Journal(self.database).start_session(
            mode="backtest", host=socket.gethostname(), pid=os.getpid(), version=__version__
        )
        self.session_id = session
        source = ReplaySource(path, pace=0.0, batch_records=REPLAY_BATCH)
        await source.start()
        started = False
        try:
            async for event in source:
                if isinstance(event, HealthEvent):
                    self._health(event)
                    continue
                records = event.records
                ts = records["ts_recv"]
                if ts.shape[0] and (int(ts[0]) < start_ns or int(ts[-1]) >= end_ns):
                    records = records[(ts >= start_ns) & (ts < end_ns)]
                if records.shape[0] == 0:
                    continue
                if not started:
                    started = True
                    self.trading.risk.start(0.0, int(records["ts_recv"][0]))
                self._batch(records)
                self._flush()
                self.run.records += int(records.shape[0])
                if self._on_records is not None:
                    self._on_records(int(records.shape[0]))
        finally:
            await source.stop()
        self._settle()
        self._flush()
        Journal(self.database).end_session(session, reason="backtest finished")
        self.run.counts = dict(self._counts)
        self.run.counts["rejected_records"] = self.features.rejected
        self.run.counts.update(self.trading.status())
        self.run.ledger_pnl = self._ledger_pnl()
        return self.run

    def _health(self, event: HealthEvent) -> None:
        if event.kind in (HealthKind.GAP, HealthKind.DISCONNECTED, HealthKind.DROPPED):
            for builder in self.features.by_id.values():
                builder.report_gap(event.at_ns)
        self._count(f"feed_{event.kind.value}")

    def _batch(self, records: np.ndarray[Any, Any]) -> None:
        """Records in feed order: the features and the broker see every record up to the moment
        bars are decided, then the bars are decided and their orders placed at that moment. The
        features take the batch as one array and hand its runs out with the books as of each
        run's end (:meth:`~feeds.features.IncrementalFeatures.closing_runs`): the runs, bars and
        books that pushing the records one at a time gives (the daemon's replay walks its events
        the same way)."""
        for run in self.features.closing_runs(records, grace_ns=self.config.daemon.close_grace_ns):
            t0 = time.perf_counter_ns()
            self._market(run.records)
            if run.on_clock and (reports := self.broker.advance(run.decided_ns - 1)):
                self._reports(reports)  # the feed clock moved without a record: orders due by then
            if run.frames:
                self._decide(run.frames, run.decided_ns, t0)

    def _market(self, records: np.ndarray[Any, Any]) -> None:
        reports = self.broker.on_records(records)
        if reports:
            self._reports(reports)

    def _flush(self) -> None:
        """Write the batch's ledger rows in one transaction and add its decisions to the log
        (one call for the batch's rows: a call per decision costs a dozen small arrays)."""
        if self._writes:
            self.ledger.record(self._writes)
            self._writes = []
        for symbol, frames in self._frames.items():
            if frames:  # joined as copies: no view keeps a batch's arrays alive
                self.run.frames[symbol].append(BarFrame.concat(frames))
                frames.clear()
        if self._rows:
            ts, inst, bar, ordered, decided_ns = zip(*self._rows, strict=True)
            steps, self._rows, self._steps = self._steps, [], []
            ts_ns = np.asarray(ts, dtype=np.int64)
            on_clock = clock_closes(
                np.asarray(decided_ns, dtype=np.int64),
                ts_ns,
                self.config.feeds.bars,
                self.config.daemon.close_grace_ns,
            )
            self._count("clock_close_bars", int(np.count_nonzero(on_clock)))
            self.run.log.add(
                ts_ns=ts_ns,
                instrument=np.asarray(inst),
                bar=np.asarray(bar),
                decided=Decided.concat([step.decided for step in steps]),
                regime=np.concatenate([step.regime for step in steps]),
                position=np.concatenate([step.positions for step in steps]),
                ordered=np.asarray(ordered),
            )

    def _reports(self, reports: list[Report]) -> None:
        """Fills go to the ledger and are counted by the orders and the position."""
        self._writes.extend(ledger_fills([r for r in reports if isinstance(r, Fill)]))
        for report in reports:
            if isinstance(report, Fill):
                self.orders.apply(report)
                self.portfolio.apply(report)
                inst, bar = self.order_bar[report.client_order_id]
                out = self.run.fills
                out.instrument.append(inst)
                out.bar.append(bar)
                out.ts_ns.append(report.ts_ns)
                out.qty.append(float(report.qty if report.side == "buy" else -report.qty))
                out.price.append(float(report.price))
                out.fee.append(report.fee)
                self._count("fills")
            elif isinstance(report, Cancelled | Reject):
                self.orders.apply(report)
                self._writes.append(
                    OrderUpdate(
                        report.client_order_id,
                        "cancelled" if isinstance(report, Cancelled) else "rejected",
                        report.ts_ns,
                        getattr(report, "reason", None),
                    )
                )
                self._count("cancelled" if isinstance(report, Cancelled) else "rejected")
            else:
                self.orders.apply(report)

    def _decide(self, frames: Sequence[BarFrame], now_ns: int, t0: int) -> None:
        """Decide the bars of ``frames`` at ``now_ns`` (one instrument's that a record closed,
        several when it closed empty bars within the grace; or every quiet instrument's that the
        clock closed then) in the daemon's rounds (:func:`agent.trading.step.decision_rounds`):
        round r is one decision of every instrument's r-th bar, only an instrument's last bar may
        send an order, and every round ends with the risk check."""
        for frame in frames:
            self._frames[frame.symbol].append(frame)
        bars_seen, rows = self.bars_seen, self._rows
        for batch in decision_rounds(frames, lambda frame: frame):
            step = self.trading.decide([close for _, close, _ in batch], self.decider)
            self._steps.append(step)  # its rows, in order, are the round's in _rows
            valid, target = step.decided.valid.tolist(), step.decided.target.tolist()
            for j, (i, (frame, close, last)) in enumerate(zip(step.slots.tolist(), batch, strict=True)):
                bar = bars_seen[i]
                bars_seen[i] += 1
                order = None
                if last and valid[j]:
                    order = self.trading.order_for(close, target[j], now_ns=now_ns, blocked=self.halted)
                    if order is not None:
                        self._send(order, i, bar)
                    self.run.latency_ns.append(time.perf_counter_ns() - t0)
                rows.append((int(frame.ts_close[close.row]), i, bar, order is not None, now_ns))
            self._check_risk(now_ns)

    def _send(self, order: NewOrder, i: int, bar: int) -> None:
        self._writes.extend(ledger_orders([order], account=ACCOUNT, session_id=self.session_id))
        self.order_bar[order.client_order_id] = (i, bar)
        self._count("orders")
        reports = self.broker.submit(order)
        if reports:
            self._reports(reports)

    def _check_risk(self, now_ns: int) -> None:
        """The end of a decision round (:meth:`TradingStep.check_risk`): a breach latches the
        halt; while halted, each round takes the next flatten step until flat."""
        breach = self.trading.check_risk(now_ns, latched=self.halted)
        if breach:
            self.halted = True
            self.run.halt_reason = breach
            self.run.halt_ns = now_ns
            self._count("risk_halts")
        if self.halted:
            for order in self.trading.flatten(now_ns) or []:
                i = self.slot[order.instrument_id]
                self._send(order, i, max(self.bars_seen[i] - 1, 0))

    def _settle(self) -> None:
        """End of data: orders still waiting for a later record are executed against the last
        book (the feed clock moves past their arrival) or closed."""
        reports = self.broker.advance(2**62)
        if reports:
            self._reports(reports)

    def _ledger_pnl(self) -> float:
        state = self.ledger.rebuild(ACCOUNT)
        total = 0.0
        for spec in self.specs:
            pos = state.positions.get(spec.instrument_id)
            if pos is None:
                continue
            per_point = spec.tick_value / spec.tick_size
            mark = self.trading.marks.get(spec.instrument_id, pos.avg_price * PRICE_SCALE) / PRICE_SCALE
            total += (pos.realized_points + pos.qty * (mark - pos.avg_price)) * per_point - pos.fees
        return total
