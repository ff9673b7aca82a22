"""The source interface: an explicit lifecycle around an async iterator of events.

Every source (replay, NATS, Databento Live) is a :class:`Source`::

    async with NatsSource(config) as source:      # start() ... stop()
        async for event in source:                # RecordBatch | HealthEvent
            ...

Lifecycle: :mod:`feeds.lifecycle` (STYLE item 6), with two rules of its own: a source that
fails to start releases at once (``_stop``) and raises :class:`FeedError`; at the end of data
iteration stops and the state stays RUNNING, and a failure while iterating makes it FAULTED (the
iterator re-raises it as FeedError). Subclasses implement ``_start``, ``_stop`` and ``_next``.
:meth:`Source.resume_after` makes a source skip what a stream already holds
(:mod:`feeds.sources.resume`: a restarted relay). Sources fed from callbacks or other threads
derive from :class:`QueuedSource`, whose bounded queue drops record batches (counted, reported
once per episode as a ``DROPPED`` health event) when the consumer falls behind, but never drops
a health event, and which reports a ``STALE`` event when nothing arrives for ``stale_after_s``.

What a source passes on (:meth:`Source._screen`, every batch of every source): with
``instruments`` given (what a daemon or a gateway trades), records of any other instrument are
counted (``counters.rejected_instrument_records``), reported once per instrument as a
``MISMATCH`` event and never reach the consumer; records of another dataset are refused the
same way by the sources that learn a record's dataset (the NATS subject, a DBN file's
metadata; ``rejected_dataset_records``). Every batch also goes through the arrival form of the
``time_backwards`` rule (:class:`feeds.health.ArrivalClock`): a record behind its instrument's
latest ``ts_recv`` is reported at once as a ``TIME_REGRESSION`` event (``time_regressions``
counts the episodes); those records are still passed on, for the features to judge.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Literal

import numpy as np

from feeds.dbn.framing import take_mbp10
from feeds.errors import FeedError
from feeds.health import ArrivalClock, TimeRegression, single_instrument
from feeds.lifecycle import Lifecycle, State
from feeds.sources.events import BatchPart, HealthEvent, HealthKind, RecordBatch, SourceCounters, SourceEvent
from feeds.sources.resume import ResumeFilter

__all__ = ["QueuedSource", "Source"]

log = logging.getLogger(__name__)


class Source(Lifecycle):
    """Base of every market-data source: lifecycle, counters and async iteration."""

    def __init__(self, name: str, *, instruments: Mapping[int, str] | None = None) -> None:
        super().__init__(name)
        self.counters = SourceCounters()
        self.dataset: str | None = None
        """Databento dataset of the records, once known (``GLBX.MDP3``)."""
        self.symbols: dict[int, str] = {}
        """instrument_id -> symbol, as far as the source knows (file symbology, live mappings)."""
        self.instruments = dict(instruments) if instruments is not None else None
        """instrument_id -> symbol of the instruments passed on; ``None``: every instrument."""
        self._allowed = np.array(sorted(self.instruments or ()), dtype=np.uint32)
        self._arrival = ArrivalClock()
        self._reported: set[tuple[str, str | int]] = set()
        """The datasets, symbols and instruments whose refusal was reported (once each)."""
        self._resume: ResumeFilter | None = None

    def _usage_error(self, message: str) -> Exception:
        return FeedError(message)

    async def _start_failed(self, exc: BaseException) -> BaseException:
        """A source releases what it acquired at once; a failure other than a FeedError (or a
        cancellation) is raised as one, naming the source."""
        await self._stop()
        if isinstance(exc, Exception) and not isinstance(exc, FeedError):
            return FeedError(f"{self.name}: cannot start: {exc}")
        return exc

    def _started(self) -> None:
        log.info("%s: started", self.name)

    def _stopped(self) -> None:
        log.info("%s: stopped (%s)", self.name, self.counters.snapshot())

    def __aiter__(self) -> Source:
        return self

    async def __anext__(self) -> SourceEvent:
        if self._state is not State.RUNNING:
            raise StopAsyncIteration
        try:
            event = await self._next()
        except FeedError:
            self._fault()
            raise
        if event is None:
            raise StopAsyncIteration
        return event

    async def next(self) -> SourceEvent | None:
        """The next event, or ``None`` at the end (the iterator protocol without
        ``StopAsyncIteration``, convenient inside tasks)."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return None

    async def next_events(self) -> list[SourceEvent]:
        """The events ready now, in order: at least one (waited for as :meth:`next` waits), or
        none at the end. A consumer that takes everything one transport read delivered at once
        (the daemon's intake) saves a pass of the event loop per event; here, one event."""
        event = await self.next()
        return [] if event is None else [event]

    async def __aenter__(self) -> Source:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def resume_after(self, resume: ResumeFilter) -> None:
        """From now on, drop the records ``resume`` drops (those a stream already holds: the
        source of a restarted relay), where they enter the source and before anything else
        (a paced replay drops them before its pacing, so they cost no time); ``resume.skipped``
        counts them. Call it after :meth:`start`, before the first event."""
        self._resume = None if resume.done else resume

    def _skip_resumed(self, records: np.ndarray) -> np.ndarray:
        """``records`` without those :meth:`resume_after` drops."""
        resume = self._resume
        if resume is None:
            return records
        records = resume.apply(records)
        if resume.done:
            self._resume = None
        return records

    def _screen(self, records: np.ndarray) -> tuple[np.ndarray, list[HealthEvent]]:
        """What the consumer gets of ``records`` (see the module docstring): the records of the
        configured instruments, and the health events to deliver before them."""
        events: list[HealthEvent] = []
        if self.instruments is not None and len(records):
            ids = records["instrument_id"]
            if single_instrument(ids) not in self.instruments:
                known = (ids[:, None] == self._allowed).any(axis=1)
                if not known.all():
                    events.extend(self._refuse_instruments(ids[~known]))
                    records = take_mbp10(records, known)
        if len(records):
            events.extend(self._regression(found) for found in self._arrival.observe(records) if found.opened)
        return records, events

    def _refuse_instruments(self, ids: np.ndarray) -> list[HealthEvent]:
        configured = ", ".join(f"{s} ({i})" for i, s in sorted((self.instruments or {}).items()))
        events = []
        for instrument_id, count in zip(*np.unique(ids, return_counts=True), strict=True):
            iid = int(instrument_id)
            symbol = self.symbols.get(iid)
            detail = (
                f"records of instrument {iid}{f' ({symbol})' if symbol else ''}, which is not in "
                f"feeds.instruments ({configured}), are counted and never traded; add it to "
                "feeds.instruments to trade it"
            )
            event = self._refuse("instrument", iid, int(count), detail)
            if event is not None:
                events.append(event)
        return events

    def _refuse(
        self, what: Literal["dataset", "instrument"], key: str | int, count: int, detail: str
    ) -> HealthEvent | None:
        """Count ``count`` records refused for their ``what`` (``key``: the dataset, symbol or
        instrument id); the first refusal of a key is logged and returns its ``MISMATCH`` event
        (``detail`` names both sides and the remedy), later ones only count."""
        if not self._count_refused(what, key, count):
            return None
        return self._refusal(what, key, count, detail)

    def _count_refused(self, what: Literal["dataset", "instrument"], key: str | int, count: int) -> bool:
        """Count ``count`` refused records; True for the first refusal of ``key`` (to report)."""
        if what == "dataset":
            self.counters.rejected_dataset_records += count
        else:
            self.counters.rejected_instrument_records += count
        if (what, key) in self._reported:
            return False
        self._reported.add((what, key))
        return True

    def _refusal(
        self, what: Literal["dataset", "instrument"], key: str | int, count: int, detail: str
    ) -> HealthEvent:
        """The logged ``MISMATCH`` event of a key's first refusal (counted already)."""
        log.warning("%s: %s", self.name, detail)
        return HealthEvent(
            HealthKind.MISMATCH,
            time.time_ns(),
            detail,
            count=count,
            instrument_id=key if isinstance(key, int) else None,
        )

    def _regression(self, found: TimeRegression) -> HealthEvent:
        """The ``TIME_REGRESSION`` event of a batch that opened an episode."""
        iid = found.instrument_id
        symbol = (self.instruments or {}).get(iid) or self.symbols.get(iid)
        back_s = (found.clock_ns - found.ts_ns) / 1e9
        name = f"{symbol} ({iid})" if symbol else f"instrument {iid}"
        detail = (
            f"{name}: ts_recv went back {back_s:.3f} s (to {found.ts_ns}, latest "
            f"{found.clock_ns}); {found.behind} record(s) behind: a feed replayed from an earlier "
            "point or a restarted publisher; not tradable until it is past its latest time again"
        )
        self.counters.time_regressions += found.opened
        log.warning("%s: %s", self.name, detail)
        return HealthEvent(
            HealthKind.TIME_REGRESSION, time.time_ns(), detail, count=found.behind, instrument_id=iid
        )

    @abc.abstractmethod
    async def _next(self) -> SourceEvent | None:
        """The next event, or ``None`` at the end of the data."""


class _End:
    """Queue marker: the producer has finished (``error`` set when it failed)."""

    __slots__ = ("error",)

    def __init__(self, error: FeedError | None) -> None:
        self.error = error


class QueuedSource(Source):
    """A source whose events are produced by callbacks (same loop) or other threads.

    ``max_batches`` bounds the record batches waiting for the consumer; beyond it new batches are
    dropped and counted. Producers call :meth:`_emit_records` / :meth:`_emit_health` /
    :meth:`_finish` on the event loop; producers on other threads hop onto it first (see
    :class:`feeds.sources.thread_bridge.ThreadBridge`).

    Besides waiting for events (:meth:`next`, :meth:`next_events`), a consumer may take what is
    queued without waiting (:meth:`take_ready`) and be told, in the producer's own callback, each
    time an event is queued (:meth:`notify`): the daemon's intake so sees a record in the pass of
    the event loop that received it, not passes later.
    """

    def __init__(
        self,
        name: str,
        *,
        max_batches: int,
        stale_after_s: float,
        instruments: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(name, instruments=instruments)
        if max_batches < 1:
            raise FeedError(f"{name}: queue size must be >= 1, got {max_batches}")
        self._max_batches = max_batches
        self._stale_after_s = stale_after_s
        self._items: collections.deque[SourceEvent | _End] = collections.deque()
        self._queued_batches = 0
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._dropping = 0
        self._stale = False
        self._on_queued: Callable[[], None] | None = None

    def notify(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (on the loop, from the producer's callback: it must not block)
        whenever an event is queued; ``None`` stops it."""
        self._on_queued = callback

    def take_ready(self) -> list[SourceEvent]:
        """Every event queued now, in order, without waiting: none when the queue is empty or
        holds only the end (which :meth:`next` returns, or raises when the producer failed)."""
        events: list[SourceEvent] = []
        items = self._items
        while items and not isinstance(item := items[0], _End):
            items.popleft()
            if isinstance(item, RecordBatch):
                self._queued_batches -= 1
                self._room.set()
            events.append(item)
        return events

    async def _wait_for_room(self) -> None:
        """Wait until the queue can take a batch (for producers that can apply back-pressure,
        like a JetStream pull loop, instead of dropping)."""
        while self._queued_batches >= self._max_batches:
            self._room.clear()
            await self._room.wait()

    def _emit_records(
        self, records: np.ndarray, transport_seq: int | None = None, part: BatchPart | None = None
    ) -> bool:
        """Screen (:meth:`Source._screen`) and queue one batch (loop thread only); returns False
        if it was dropped (queue full)."""
        records, events = self._screen(self._skip_resumed(records))
        for event in events:
            self._push(event)
        n = int(records.shape[0])
        if n == 0:
            return True
        if self._queued_batches >= self._max_batches:
            self._dropping += n
            self.counters.dropped_records += n
            return False
        now = time.time_ns()
        if self._dropping:
            self._push(
                HealthEvent(
                    HealthKind.DROPPED, now, "consumer fell behind; records dropped", count=self._dropping
                )
            )
            log.warning("%s: dropped %d records (consumer too slow)", self.name, self._dropping)
            self._dropping = 0
        if self._stale:
            self._stale = False
        self.counters.batches += 1
        self.counters.records += n
        self._queued_batches += 1
        self._push(RecordBatch(records, now, transport_seq, part))
        return True

    def _emit_health(self, event: HealthEvent) -> None:
        """Queue a health event (loop thread only); health events are never dropped."""
        self._push(event)

    def _finish(self, error: FeedError | None = None) -> None:
        """The producer is done (loop thread only); iteration ends, or raises ``error``."""
        self._push(_End(error))

    def _on_stale(self) -> None:
        """Nothing came for another ``stale_after_s`` (on the loop; the first call of a stale
        episode comes before its ``STALE`` event, then one each interval while it lasts): a
        hook for sources that can find out why (``counters.stale`` numbers the episode)."""

    def _push(self, item: SourceEvent | _End) -> None:
        self._items.append(item)
        self._wakeup.set()
        if self._on_queued is not None:
            self._on_queued()

    async def _next(self) -> SourceEvent | None:
        # Yield to the loop on every call: a consumer that never waits (the queue is full) must
        # not starve the transport's own tasks (socket reads, pings, the pull loop).
        await asyncio.sleep(0)
        while not self._items:
            self._wakeup.clear()
            try:
                async with asyncio.timeout(self._stale_after_s):
                    await self._wakeup.wait()
            except TimeoutError:
                self._on_stale()
                if not self._stale:
                    self._stale = True
                    self.counters.stale += 1
                    log.warning("%s: no data for %.1f s", self.name, self._stale_after_s)
                    return HealthEvent(
                        HealthKind.STALE, time.time_ns(), f"no data for {self._stale_after_s:g} s"
                    )
        item = self._items.popleft()
        if isinstance(item, _End):
            self._items.appendleft(item)  # keep returning the end
            if item.error is not None:
                raise item.error
            return None
        if isinstance(item, RecordBatch):
            self._queued_batches -= 1
            self._room.set()
        return item

    async def next_events(self) -> list[SourceEvent]:
        """The first event as :meth:`next` gives it, and every event queued behind it (up to the
        end or a failure, which the next call returns or raises)."""
        first = await self.next()
        if first is None:
            return []
        return [first, *self.take_ready()]
