"""The decision clock: which records each bar covers and when it closes.

Two clocks (:class:`feeds.config.BarConfig`):

``time``
    Bars close at the multiples of ``interval_s`` of the UNIX epoch (``ts_recv`` clock, ns).
    Bar ``k`` covers ``((k - 1) * I, k * I]``: a record stamped exactly on a boundary belongs
    to the bar that closes there. A bar is *closed* by the first record after its close time,
    or by the clock a grace after it (:func:`decision_times`: the daemon's intake live, the
    replays on the feed clock), so the bar holding the last record of a file is still open and
    is not emitted. Bars with no record carry the book forward. After
    ``stale_after_s`` without a record the instrument is stale: the first bar that closes stale is
    emitted (not tradable) and the following empty bars are skipped until data resumes, so an
    overnight or weekend gap (or a corrupt far-future timestamp) costs a handful of bars, not
    millions. Records use the running maximum of ``ts_recv`` as their clock, so a record that
    goes back in time (flagged by the health checks) stays in the open bar.
``events``
    A bar closes on every ``events``-th record of the instrument, at that record's clock; the
    records after the last full bar form the open bar.

Both paths share these definitions: :func:`plan_bars` computes the bars of a whole array,
:class:`BarClock` the same bars one record at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from feeds.config import BarConfig
from feeds.errors import FeedError

__all__ = ["BarClock", "BarPlan", "clock_closes", "decision_times", "plan_bars"]


def _interval_ns(config: BarConfig) -> int:
    ns = round(config.interval_s * 1e9)
    if ns <= 0:
        raise FeedError(f"feeds.bars.interval_s must be positive, got {config.interval_s!r}")
    return ns


def _events(config: BarConfig) -> int:
    if config.events <= 0:
        raise FeedError(f"feeds.bars.events must be positive, got {config.events!r}")
    return config.events


@dataclasses.dataclass(frozen=True, slots=True)
class BarPlan:
    """Closed bars of an array of records: bar ``j`` covers records ``[ends[j-1], ends[j])``
    (``ends[-1]`` before the first bar is 0) and closes at ``close_ts[j]`` (UNIX ns). Both are
    int64 ``(n_bars,)``; ``ends`` is non-decreasing (equal ends: a bar with no record)."""

    ends: np.ndarray
    close_ts: np.ndarray


def plan_bars(clock_ts: np.ndarray, config: BarConfig, stale_ns: int) -> BarPlan:
    """The closed bars of one instrument's records whose clock (running maximum of ``ts_recv``,
    int64 ``(n,)``, non-decreasing) is ``clock_ts``. ``stale_ns`` is the stale interval in ns."""
    n = clock_ts.shape[0]
    if config.clock == "events":
        events = _events(config)
        ends = np.arange(events, n + 1, events, dtype=np.int64)
        return BarPlan(ends=ends, close_ts=clock_ts[ends - 1].astype(np.int64))
    interval = _interval_ns(config)
    if n == 0:
        return BarPlan(np.zeros(0, np.int64), np.zeros(0, np.int64))
    kid = -(-clock_ts // interval)  # bar of each record: ceil(ts / I)
    change = np.flatnonzero(kid[1:] != kid[:-1])
    k_rec = kid[change]  # bars holding records, closed by the next record
    last_ts = clock_ts[change]  # last record of each of them
    k_next = kid[change + 1]
    # empty bars after each: k_rec+1 .. min(k_next - 1, first bar closing stale)
    k_max = (last_ts + stale_ns) // interval + 1
    n_empty = np.maximum(np.minimum(k_next - 1, k_max) - k_rec, 0)
    counts = n_empty + 1
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    step = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
    ks = np.repeat(k_rec, counts) + step
    ends = np.repeat(change + 1, counts).astype(np.int64)
    return BarPlan(ends=ends, close_ts=ks * interval)


def decision_times(
    closer_ns: np.ndarray, close_ts: np.ndarray, config: BarConfig, grace_ns: int
) -> np.ndarray:
    """When each bar is decided, on the feed clock (ns): the moment a live daemon closes it
    (``daemon.close_grace_ms``, ``grace_ns`` in ns). ``closer_ns`` is the time of the record that
    closes it (a time bar: the instrument's first record past the bar; an event bar: its own
    last record), ``close_ts`` its close time. A time bar whose closer comes more than the grace
    after its close time is closed by the clock ``grace_ns + 1`` ns after it (the first moment the
    daemon's intake finds it due, :meth:`agent.daemon.intake.Intake._close_due`); every other bar
    at its closer. The backtests and the trainer decide and place orders at these times (an
    order meets the book ``broker.latency_ms`` later). int64 arrays, one entry per bar."""
    if config.clock != "time":
        return closer_ns
    decided: np.ndarray = np.minimum(closer_ns, close_ts + grace_ns + 1)
    return decided


def clock_closes(decided_ns: Any, close_ts: Any, config: BarConfig, grace_ns: int) -> Any:
    """Which bars are closed on the clock: time bars decided (:func:`decision_times`, or the
    closer's time, which says the same) more than ``grace_ns`` after their close time
    ``close_ts``. Python ints give a bool, int64 arrays a bool array (none true on the event
    clock)."""
    return (decided_ns - close_ts > grace_ns) & (config.clock == "time")


class BarClock:
    """:func:`plan_bars` one record at a time, for one instrument.

    Call :meth:`on_record` with each record's ``ts_recv`` *before* adding the record to the open
    bar: it returns the close times of the bars that this record closes (time clock). After
    adding it, :meth:`after_record` says whether the record closed the bar itself (event clock).
    :meth:`on_clock` closes time bars from the caller's clock.
    """

    def __init__(self, config: BarConfig, stale_ns: int) -> None:
        self._time = config.clock == "time"
        self._interval = _interval_ns(config) if self._time else 0
        self._events = _events(config) if not self._time else 0
        self._stale = stale_ns
        self._open_k = -1  # time clock: the open bar (-1 before the first record)
        self._open_has_records = False
        self._count = 0  # event clock: records in the open bar
        self._inside = -1  # time clock: a record at or before this ts_recv stays in the open bar
        self.clock_ts = 0
        """Clock (running maximum of ``ts_recv``, ns) of the last record."""

    def on_record(self, ts_recv: int) -> Sequence[int]:
        """Close times (ns) of the bars closed by a record received at ``ts_recv``."""
        if ts_recv <= self._inside or not self._time:  # the usual case: the record falls in the open bar
            if ts_recv > self.clock_ts:  # noqa: PLR1730 (a call to max() costs more, once per record)
                self.clock_ts = ts_recv
            return ()
        k = -(-ts_recv // self._interval)
        closes: list[int] = []
        if self._open_k < 0:
            self._open_k = k
        elif k > self._open_k:
            closes = self._close_until(k - 1)
            self._open_k = k
        self.clock_ts = max(self.clock_ts, ts_recv)
        self._open_has_records = True
        self._inside = self._open_k * self._interval
        return closes

    def would_close(self, records: int, latest_ts: int) -> bool:
        """Whether ``records`` more records, the latest received at ``latest_ts``, close the open
        bar: one past its close time (time clock), or the ones that complete it (event clock).
        A look-ahead that changes nothing (the time clock's first bar is not known yet)."""
        if self._time:
            return self._open_k >= 0 and latest_ts > self._open_k * self._interval
        return self._count + records >= self._events

    def after_record(self) -> bool:
        """Event clock: ``True`` when the record just added closes the open bar."""
        if self._time:
            return False
        self._count += 1
        if self._count == self._events:
            self._count = 0
            return True
        return False

    def on_clock(self, now_ns: int) -> list[int]:
        """Time clock: close times of the bars that close strictly before ``now_ns``."""
        if not self._time or self._open_k < 0:
            return []
        last = (now_ns - 1) // self._interval
        if last < self._open_k:
            return []
        closes = self._close_until(last)
        self._open_k = last + 1
        self._inside = -1  # the new open bar has no record yet
        return closes

    def _close_until(self, k_last: int) -> list[int]:
        """Close the open bar (always, when it holds records) and the empty bars after it up to
        ``k_last``, except those after the first bar that closes stale."""
        interval = self._interval
        k = self._open_k
        closes: list[int] = []
        if self._open_has_records:
            closes.append(k * interval)
            k += 1
            self._open_has_records = False
        stop = min(k_last, (self.clock_ts + self._stale) // interval + 1)
        closes.extend(range(k * interval, (stop + 1) * interval, interval))
        return closes
