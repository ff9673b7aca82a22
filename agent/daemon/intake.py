"""Intake: market data from the source to the paper venue and the features, and the bar closes
into the bounded decision queue.

The feed task reads the source (:class:`feeds.sources.Source`) and pushes its records through
the paper venue (fills against the book) and the incremental book/health/bars/features
(:class:`feeds.features.IncrementalFeatures`). Each bar that closes enters the
:class:`DecisionQueue` with the wall-clock arrival of the record that closed it (the decision's
latency and staleness are measured from it). The queue is bounded (``daemon.decision_queue``):
when the decision task falls behind, the oldest bar closes are dropped and counted
(``dropped_decisions``); a slow consumer never blocks the feed.

* A **live** feed (NATS, Databento Live) is taken in coalesced runs: an intake task moves the
  source's events into an inbox, and the feed task pushes each stretch of consecutive record
  batches through the venue and the features as one array (see :meth:`Intake._live`).
* A **replay** runs on the feed's clock, as the event-driven backtest does: the records up to
  the moment bars are decided (the record that closes them, or the moment the clock closes
  them, below) reach the venue and the features, the ledger writes they caused are committed
  (their fills count in the position), then the bars are decided and their orders placed at
  that moment, before the next record (:meth:`Intake._replay_feed`). A replayed day gives the
  backtest's decisions, orders and fills.

A bar also closes **on the clock**: a time bar whose instrument sends nothing past its boundary
closes ``daemon.close_grace_ms`` after that boundary, on the feed clock (:meth:`Intake._close_due`):
by the first record of any instrument stamped that late, or, on a feed that is quiet altogether,
by a timer on the feed clock extrapolated with the wall clock. A bar is never closed ahead of
records already received and not yet pushed, and a quiet instrument's decision waits for the
grace, not for the status tick. Such bars are counted (``clock_closes``) and measured from the
moment they close, and their orders are placed at that moment on the feed clock. A replay closes
them at the same moments (:func:`feeds.bars.decision_times`), as the backtests do.

Health events of the source are counted (``feed_<kind>``, ``rejected_messages``), logged, and
mark every builder's bars after a gap or a disconnection not tradable; gaps, reconnections and
disconnections are also published and journaled. A source that fails halts new orders
(``venue``) and FAULTs the intake (the watchdog pings stop).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.daemon.events import Events
from agent.daemon.lifecycle import Component, State
from agent.daemon.metrics import DaemonMetrics
from agent.execution.venues import Venue
from feeds.dbn.framing import concat_mbp10
from feeds.features import BarFrame, IncrementalFeatures
from feeds.sources import HealthEvent, HealthKind, QueuedSource, RecordBatch, Source, SourceEvent

__all__ = ["INTAKE_BATCHES", "Close", "DecisionQueue", "Intake", "closing_arrivals"]

log = logging.getLogger(__name__)

INTAKE_BATCHES = 64
"""Record batches a live feed's run waits for at most (one JetStream fetch by default)."""


@dataclass(slots=True)
class Close:
    """One bar close waiting for its decision."""

    frame: BarFrame
    arrival_ns: int
    """Wall clock (UNIX ns) when the batch holding the closing record was received."""
    at_ns: int
    """Feed clock (UNIX ns) when the bar closed: the last record pushed, or the moment the clock
    closed it; its orders are placed no earlier (:meth:`Intake.order_ns`)."""


class DecisionQueue:
    """Bar closes waiting for the decision task: bounded, the oldest dropped and counted."""

    def __init__(self, limit: int, metrics: DaemonMetrics) -> None:
        self._limit = limit
        self._metrics = metrics
        self._closes: collections.deque[Close] = collections.deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        """Set when the decision task has taken every queued close and decided it."""

    def __iter__(self) -> Iterator[Close]:
        return iter(self._closes)

    def put(self, frames: list[BarFrame], arrivals_ns: list[int], at_ns: int) -> None:
        for frame, arrival_ns in zip(frames, arrivals_ns, strict=True):
            self._closes.append(Close(frame, arrival_ns, at_ns))
        while len(self._closes) > self._limit:
            self._closes.popleft()
            self._metrics.dropped("decision_queue")
        self._ready.set()

    async def take(self) -> list[Close]:
        """Every queued close, once some were put (the decision task)."""
        await self._ready.wait()
        self._ready.clear()
        closes = list(self._closes)
        self._closes.clear()
        return closes

    def taken(self) -> None:
        """The decision task decided what it took; idle when nothing new is queued."""
        if not self._closes:
            self._idle.set()

    async def decide(self, frames: list[BarFrame], arrivals_ns: list[int], at_ns: int) -> None:
        """Put the closes and wait until they are decided (a replay, on the feed's clock)."""
        self._idle.clear()
        self.put(frames, arrivals_ns, at_ns)
        await self._idle.wait()


class Intake(Component):
    """The feed task (see the module docstring). ``settle`` waits until every queued ledger
    write is committed and applied (a replay calls it before each decision)."""

    def __init__(
        self,
        *,
        source: Source,
        features: IncrementalFeatures,
        venue: Venue,
        queue: DecisionQueue,
        metrics: DaemonMetrics,
        events: Events,
        replay: bool,
        venue_latency_ns: int,
        settle: Callable[[], Awaitable[None]],
        bar_interval_ns: int = 0,
        close_grace_ns: int = 0,
    ) -> None:
        super().__init__("intake")
        self.source = source
        self._features = features
        self._venue = venue
        self._queue = queue
        self._metrics = metrics
        self._events = events
        self._replay = replay
        self._venue_latency_ns = venue_latency_ns
        self._settle = settle
        self._interval_ns = bar_interval_ns
        """Time bars: their length (0: event bars, which never close on the clock)."""
        self._grace_ns = close_grace_ns
        self._next_close_ns = 0
        """The earliest boundary whose bars are not closed by the clock yet."""
        self._timer: asyncio.TimerHandle | None = None
        self._inbox: collections.deque[SourceEvent] = collections.deque()
        """A live feed's events received and not yet pushed (see :meth:`_live`)."""
        self._live_source: QueuedSource | None = None
        """The source of a live feed (:meth:`_live`), whose queue the inbox takes in."""
        self._ready = asyncio.Event()
        """Set when the source queued events or the inbox has some, the source ended, or a bar is
        due on the clock."""
        self.clock_ns = 0
        """Latest ``ts_recv`` seen (the feed's clock, UNIX ns)."""
        self._wall_ns = 0
        """Wall clock when the feed clock last moved."""

    @property
    def alive(self) -> bool:
        """The feed task runs (not failed, not at the end of the data, not stopped)."""
        return self.state is State.RUNNING and any(not t.done() for t in self._tasks)

    def feed_now(self) -> int:
        """The feed clock extrapolated with the wall clock since the last record: equal to the
        wall clock for a live feed, and never ahead of a replayed (historical) feed's pace."""
        if not self.clock_ns:
            return time.time_ns()
        return self.clock_ns + max(0, time.time_ns() - self._wall_ns)

    async def fed(self) -> None:
        """Until the feed task ended (the end of the data); its error if it failed."""
        await asyncio.gather(*self._tasks)

    def poll(self) -> None:
        """The status tick of a live feed: the stale checks and the bars due on the clock
        (:meth:`_close_due`), and the paper book's clock moved on."""
        if self._replay or not self.clock_ns:
            return
        self._close_due(force=True)
        self._venue.advance(self.feed_now())

    def _close_due(self, *, force: bool = False) -> None:
        """Close the bars whose boundary is more than the grace behind the feed clock: the last
        record's while received records wait to be pushed (no bar closes ahead of them), else
        :meth:`feed_now`. Cheap when nothing is due (after every run); ``force`` (the tick) also
        runs the features' stale checks. Arms the timer for the next boundary."""
        if not self.clock_ns:
            return
        self._take_ready()  # records received and still queued hold the clock back too
        due = (self.clock_ns if self._inbox else self.feed_now()) - self._grace_ns
        if not force and not (self._interval_ns and due > self._next_close_ns):
            if self._interval_ns and self._timer is None:
                self._arm()  # the timer fired early (the feed clock is extrapolated)
            return
        frames = self._features.poll(due)
        if frames:  # the orders that arrived by now execute first (the paper book's clock moves)
            self._venue.advance(due + self._grace_ns - 1)
            self._metrics.count("clock_closes", len(frames))
            self._queue.put(frames, [time.time_ns()] * len(frames), due + self._grace_ns)
        if self._interval_ns:
            self._next_close_ns = max(self._next_close_ns, -(-due // self._interval_ns) * self._interval_ns)
            self._arm()

    def _arm(self) -> None:
        """Wake the feed task when the next boundary is the grace behind the feed clock."""
        if self._timer is not None:
            self._timer.cancel()
        wait_ns = self._next_close_ns + self._grace_ns + 1 - self.feed_now()
        self._timer = asyncio.get_running_loop().call_later(max(0, wait_ns) / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._ready.set()

    async def _start(self) -> None:
        await self.source.start()
        self._task(self._feed(), "feed")

    async def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self.source.stop()
        await self._cancel_tasks()

    async def _feed(self) -> None:
        source = self.source
        try:
            if self._replay:
                await self._replay_feed(source)
            else:
                assert isinstance(source, QueuedSource)  # live sources queue what their transport delivers
                await self._live(source)
            log.warning("%s: end of data", source.name)
            # The book stands still after the last record: orders still on their way to the paper
            # book arrive and execute against it.
            self._venue.advance(self.clock_ns + self._venue_latency_ns + 1)
        except Exception:
            self._fault()
            log.exception("market-data source failed; no new orders")
            self._events.halts.set("venue", "market data source failed")
            raise

    async def _replay_feed(self, source: Source) -> None:
        """Replay on the feed's clock: each event's records pushed as one array and handed back
        run by run (:meth:`~feeds.features.IncrementalFeatures.closing_runs`), each run's closes
        decided at their moment (their closing record's, or the clock's a grace after a quiet
        instrument's boundary) before the next run reaches the venue, as the event-driven
        backtest does."""
        async for event in source:
            if isinstance(event, HealthEvent):
                self._on_health(event)
                continue
            for run in self._features.closing_runs(event.records, grace_ns=self._grace_ns):
                if len(run.records):
                    self._moved(int(run.records["ts_recv"][-1]))
                    self._venue.on_records(run.records)
                if run.on_clock:  # as live: the paper book's clock moves to the clock close
                    self._venue.advance(run.decided_ns - 1)
                if run.frames:
                    await self._settle()
                    arrival = time.time_ns()
                    await self._queue.decide(list(run.frames), [arrival] * len(run.frames), run.decided_ns)

    async def _live(self, source: QueuedSource) -> None:
        """A live feed in coalesced runs: this task takes the events at the head of an inbox as
        one run (:meth:`_next_run`) and pushes each stretch of consecutive record batches
        through the venue and the features as one array. A NATS message carries a few records,
        and the per-call costs of the book, bars, features and the paper broker are ~100 us:
        one call per message cannot keep up with 10k records/s, one call per run can. Health
        events are handled in their place between runs; after each run the bars due on the
        clock close (:meth:`_close_due`).

        The source wakes this task as it queues an event (:meth:`QueuedSource.notify`), and the
        task takes what is queued into the inbox itself (:meth:`_take_ready`): a closing record
        reaches the features in the pass of the event loop after the one that received it. (An
        intake task that moved the events into the inbox cost two more passes, each holding
        whatever else the loop had ready, such as the next transport read.) An intake task
        still waits on the source for what only waiting gives: the end of the data, a failure,
        and a stale feed's health event."""
        inbox, ready = self._inbox, self._ready
        self._live_source = source
        source.notify(ready.set)
        intake = asyncio.get_running_loop().create_task(_inbox(source, inbox, ready), name="inbox")
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
                self._close_due()
            intake.result()  # the source's failure, if it failed
        finally:
            source.notify(None)
            self._live_source = None
            intake.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await intake

    async def _next_run(self, inbox: collections.deque[SourceEvent], intake: asyncio.Task[None]) -> int:
        """How many events at the head of ``inbox`` form the next run.

        The run sees every record received up to now (the source's queue is taken into the
        inbox first). Without a batch that closes a bar it waits while passes of the loop bring
        more, up to :data:`INTAKE_BATCHES` events. A batch that closes a bar ends the wait at
        once: no bar's decision waits for records still to come, nor for another pass of the
        loop (those of other instruments whose bars close later are decided in the next round).
        A run that closes bars ends with the last batch that closes one: the batches behind it
        wait for the next run, processed once the decision task took the bars (one batched
        decision for the instruments whose bars closed together). Where a run ends never
        changes the bars."""
        pending: collections.Counter[int] = collections.Counter()
        scanned = closing = 0
        self._take_ready()
        while True:
            for k in range(scanned, len(inbox)):
                event = inbox[k]
                if isinstance(event, RecordBatch) and self._features.closing(event.records, pending):
                    closing = k + 1
            scanned = len(inbox)
            if closing or scanned >= INTAKE_BATCHES or intake.done():
                break
            await asyncio.sleep(0)
            self._take_ready()
            if len(inbox) == scanned:
                break
        return closing or scanned

    def _take_ready(self) -> None:
        """A live feed: the events its source has queued, moved into the inbox now."""
        if self._live_source is not None:
            self._inbox.extend(self._live_source.take_ready())

    def _on_run(self, run: list[RecordBatch]) -> None:
        """Consecutive record batches as one array; each bar they close is measured from the
        arrival of the batch holding the record that closed it (:func:`closing_arrivals`)."""
        if not run:
            return
        self._metrics.count("feed_runs")
        if len(run) == 1:
            self._on_records(run[0].records, run[0].received_ns)
            return
        received = np.array([b.received_ns for b in run], dtype=np.int64)
        arrivals = np.repeat(received, [len(b.records) for b in run])
        self._on_records(concat_mbp10([b.records for b in run]), arrivals)

    def _on_records(
        self, records: np.ndarray[Any, np.dtype[np.void]], arrival: int | np.ndarray[Any, np.dtype[np.int64]]
    ) -> None:
        """Feed the venue and the features; queue the bars that closed. ``arrival``: when
        ``records`` arrived (UNIX ns), or, where they came in several batches, when each did."""
        self._moved(int(records["ts_recv"][-1]))
        self._venue.on_records(records)
        frames = self._features.push_records(records)
        if not frames:
            return
        if isinstance(arrival, int):
            self._queue.put(frames, [arrival] * len(frames), self.clock_ns)
        else:
            self._queue.put(frames, closing_arrivals(records, arrival, frames), self.clock_ns)

    def order_ns(self, close: Close) -> int:
        """The feed time an order of ``close`` is placed at: the feed clock now, and never before
        the bar closed (a bar closed on the clock is placed at that moment, not at the last
        record's time, which is earlier)."""
        return max(self.clock_ns, close.at_ns)

    def _moved(self, ts_recv: int) -> None:
        self.clock_ns = max(self.clock_ns, ts_recv)
        self._wall_ns = time.time_ns()

    def _on_health(self, event: HealthEvent) -> None:
        kind = event.kind
        if kind in (HealthKind.GAP, HealthKind.DISCONNECTED, HealthKind.DROPPED):
            for builder in self._features.by_id.values():
                builder.report_gap(event.at_ns)
        self._metrics.feed_event(event)
        log.warning("feed %s: %s", kind.value, event.detail)
        if kind in (HealthKind.GAP, HealthKind.RECONNECTED, HealthKind.DISCONNECTED):
            self._events.emit(kind.value, event.detail or kind.value, details={"count": event.count})


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


async def _inbox(source: Source, inbox: collections.deque[SourceEvent], ready: asyncio.Event) -> None:
    """Move the source's events into ``inbox``, all those ready at once (see :meth:`Intake._live`)."""
    try:
        while events := await source.next_events():
            inbox.extend(events)
            ready.set()
    finally:
        ready.set()
