"""Book health per instrument: the rules, their counters and their episodes.

The rules are written once, over arrays (:func:`record_faults`): the vectorised path calls them on
a whole file, the incremental path on the records of each bar as it closes (see
:mod:`feeds.features`), so both judge every record identically. A record gets a bit mask of the
checks it fails:

``sequence``
    The record's ``sequence`` is lower than the previous record's *of the same instrument*
    (out-of-order, replayed or reset feed), unless the record ends a stale silence (a venue
    restarts its sequence with a new session). Databento's ``sequence`` is the venue's number per
    *channel*, shared by every instrument of the channel, so a subscription to some instruments
    sees forward jumps by design; a forward jump is judged a gap only when it exceeds
    ``HealthConfig.max_sequence_gap`` (0, the default, disables the forward check). Equal
    sequences are normal (one venue packet can carry several book events).
``crossed``
    Best bid >= best ask (crossed or locked top of book), both sides present.
``empty_side``
    A side has no top level (price ``UNDEF_PRICE`` or size 0).
``bad_price``
    A present top-of-book price <= 0, a trade (action ``T``) with a price that is ``UNDEF`` or
    <= 0, or a best bid or ask that moved more than ``max_price_jump_ticks`` ticks from the
    previous record (both records with a present, positive top).
``time_backwards``
    ``ts_recv`` earlier than the latest ``ts_recv`` seen before it for the instrument (the bar
    clock runs on that running maximum, so such a record never moves the clock back).
``stale``
    No record for more than ``stale_after_s``: judged between consecutive records (replay, where
    the clock is the records' own ``ts_recv``) and against a clock the caller passes (live). A
    stale episode starts at ``last ts_recv + stale_after`` and ends at the next record.
``gap``
    The transport reported missing records (a source's ``GAP``/``DISCONNECTED`` health event),
    passed in by the caller; it ends with the next record.

The first four are *record faults*: a record with any of them is unhealthy and its data never
reaches the features as valid (the bar that holds it is not tradable; see :mod:`feeds.features`).
``time_backwards`` is a record fault as well. Each check has a counter (failing records; one
per stale or gap episode), and each maximal run of failures is one :class:`HealthEpisode`
(start, end, check, count), logged once when it opens (WARNING) and once when it closes (INFO).

The features judge a record when its bar closes, and a feed replayed from an earlier point
closes no bar until it has caught up (the bar clock runs on the latest ``ts_recv``). So the
``time_backwards`` rule is also applied as records arrive, by :class:`ArrivalClock` (every
source runs it on every batch): the first record behind the clock is reported at once.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
from typing import Any

import numpy as np

from feeds.config import HealthConfig
from feeds.records import ACTION_TRADE, MBP10_CODES, UNDEF_PRICE

__all__ = [
    "RECORD_FAULTS",
    "ArrivalClock",
    "Check",
    "HealthEpisode",
    "HealthMonitor",
    "HealthState",
    "PrevTop",
    "TimeRegression",
    "clock_before_each",
    "fault_mask",
    "record_faults",
    "single_instrument",
    "valid_top",
]

log = logging.getLogger(__name__)


class Check(enum.StrEnum):
    """One health check; :attr:`bit` is its bit in a record's fault mask."""

    SEQUENCE = "sequence"
    CROSSED = "crossed"
    EMPTY_SIDE = "empty_side"
    BAD_PRICE = "bad_price"
    TIME_BACKWARDS = "time_backwards"
    STALE = "stale"
    GAP = "gap"

    @property
    def bit(self) -> int:
        return _BITS[self]


_BITS: dict[Check, int] = {check: 1 << i for i, check in enumerate(Check)}
_RECORD_CHECKS: tuple[Check, ...] = (
    Check.SEQUENCE,
    Check.CROSSED,
    Check.EMPTY_SIDE,
    Check.BAD_PRICE,
    Check.TIME_BACKWARDS,
)
_SEQUENCE, _CROSSED, _EMPTY_SIDE, _BAD_PRICE, _TIME_BACKWARDS = (c.bit for c in _RECORD_CHECKS)
RECORD_FAULTS: int = sum(c.bit for c in _RECORD_CHECKS)
"""Mask of the checks judged per record (a record failing any of them is unhealthy)."""
_TRADE = ord(ACTION_TRADE)


@dataclasses.dataclass(frozen=True, slots=True)
class PrevTop:
    """What the record rules need of the instrument's previous record.

    ``ts_recv`` is the running maximum of ``ts_recv`` so far (UNIX ns); ``bid``/``ask`` are the
    previous record's best prices (fixed point), ``UNDEF_PRICE`` when absent or not positive.
    """

    ts_recv: int
    sequence: int
    bid: int
    ask: int


def fault_mask(
    *,
    bid: Any,
    ask: Any,
    bid_sz: Any,
    ask_sz: Any,
    trade_price: Any,
    ts: Any,
    clock_before: Any,
    seq: Any,
    seq_before: Any,
    bid_before: Any,
    ask_before: Any,
    tick: int,
    config: HealthConfig,
) -> Any:
    """The record rules, written once for both paths: every operand is either a Python int (one
    record, the incremental path) or an int64 array (one entry per record, the vectorised path).

    ``bid``/``ask`` best prices (fixed point), ``bid_sz``/``ask_sz`` their sizes,
    ``trade_price`` the event price of a trade record (``1`` for other records: always valid),
    ``ts`` the record's ``ts_recv``, ``clock_before`` the running maximum of ``ts_recv`` before
    it (``ts`` for the first record), ``seq``/``seq_before`` its and the previous record's
    sequence, ``bid_before``/``ask_before`` the previous record's best prices when present and
    positive, else ``UNDEF_PRICE``. Returns the fault bits (int, or an int array).
    """
    empty = (bid == UNDEF_PRICE) | (ask == UNDEF_PRICE) | (bid_sz == 0) | (ask_sz == 0)
    present = empty ^ True
    crossed = present & (bid >= ask)
    ok_bid = (bid != UNDEF_PRICE) & (bid > 0)
    ok_ask = (ask != UNDEF_PRICE) & (ask > 0)
    limit = config.max_price_jump_ticks * tick
    stale_ns = round(config.stale_after_s * 1e9)
    jump = (ok_bid & (bid_before != UNDEF_PRICE) & (abs(bid - bid_before) > limit)) | (
        ok_ask & (ask_before != UNDEF_PRICE) & (abs(ask - ask_before) > limit)
    )
    bad = (present & ((ok_bid & ok_ask) ^ True)) | (trade_price == UNDEF_PRICE) | (trade_price <= 0) | jump
    seq_bad = seq < seq_before
    if config.max_sequence_gap > 0:
        seq_bad = seq_bad | (seq - seq_before > config.max_sequence_gap)
    # after a stale silence the venue may have restarted its sequence (a new session)
    seq_bad = seq_bad & (ts - clock_before <= stale_ns)
    return (
        empty * _EMPTY_SIDE
        | crossed * _CROSSED
        | bad * _BAD_PRICE
        | (ts < clock_before) * _TIME_BACKWARDS
        | seq_bad * _SEQUENCE
    )


def valid_top(px: int) -> int:
    """``px`` when it is a present, positive price, else ``UNDEF_PRICE`` (what the jump rule
    compares with)."""
    return px if px != UNDEF_PRICE and px > 0 else UNDEF_PRICE


def record_faults(
    records: np.ndarray,
    bid: np.ndarray,
    ask: np.ndarray,
    *,
    prev: PrevTop | None,
    tick: int,
    config: HealthConfig,
) -> np.ndarray:
    """:func:`fault_mask` of every record of ``records`` (one instrument, arrival order), uint8
    ``(n,)``. ``bid``/``ask`` are the records' best prices (int64 ``(n,)``), ``prev`` the
    instrument's previous record (``None`` at the start of the stream), ``tick`` the tick size
    in fixed point."""
    n = records.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    ts = records["ts_recv"].astype(np.int64)
    seq = records["sequence"].astype(np.int64)
    ok_bid = (bid != UNDEF_PRICE) & (bid > 0)
    ok_ask = (ask != UNDEF_PRICE) & (ask > 0)
    bid_before = np.empty(n, dtype=np.int64)
    ask_before = np.empty(n, dtype=np.int64)
    bid_before[1:] = np.where(ok_bid[:-1], bid[:-1], UNDEF_PRICE)
    ask_before[1:] = np.where(ok_ask[:-1], ask[:-1], UNDEF_PRICE)
    clock_before = clock_before_each(ts, None if prev is None else prev.ts_recv)
    seq_before = np.empty(n, dtype=np.int64)
    seq_before[1:] = seq[:-1]
    if prev is None:
        bid_before[0] = ask_before[0] = UNDEF_PRICE
        seq_before[0] = seq[0]
    else:
        bid_before[0], ask_before[0], seq_before[0] = prev.bid, prev.ask, prev.sequence
    trades = np.flatnonzero(records.view(MBP10_CODES)["action"] == _TRADE)
    trade_price = np.ones(n, dtype=np.int64)
    trade_price[trades] = records["price"][trades]
    faults = fault_mask(
        bid=bid,
        ask=ask,
        bid_sz=records["bid_sz_00"],
        ask_sz=records["ask_sz_00"],
        trade_price=trade_price,
        ts=ts,
        clock_before=clock_before,
        seq=seq,
        seq_before=seq_before,
        bid_before=bid_before,
        ask_before=ask_before,
        tick=tick,
        config=config,
    )
    return np.asarray(faults, dtype=np.uint8)


def clock_before_each(ts: np.ndarray, clock: int | None) -> np.ndarray:
    """The clock before each record: the running maximum of ``ts_recv`` (int64 ``(n,)``, one
    instrument, arrival order, ``n >= 1``) before it, ``clock`` being the maximum before the
    first one (``None`` at the start of the stream: the first record is its own clock). A record
    whose ``ts_recv`` is below its entry went back in time (the ``time_backwards`` rule)."""
    out = np.empty(ts.shape[0], dtype=np.int64)
    np.maximum.accumulate(ts[:-1], out=out[1:])
    out[0] = ts[0] if clock is None else clock
    if clock is not None:
        np.maximum(out, clock, out=out)
    return out


def prev_top_of(records: np.ndarray, bid: np.ndarray, ask: np.ndarray, clock: int) -> PrevTop:
    """The :class:`PrevTop` after ``records`` (non-empty), whose clock (running maximum of
    ``ts_recv``, the previous records' included) is ``clock`` after the last one."""
    return PrevTop(
        ts_recv=clock,
        sequence=int(records["sequence"][-1]),
        bid=valid_top(int(bid[-1])),
        ask=valid_top(int(ask[-1])),
    )


@dataclasses.dataclass(slots=True)
class HealthEpisode:
    """One episode of a failing check: ``[start_ns, end_ns)`` in UNIX ns (``end_ns`` is ``None``
    while it is open). ``count`` is the number of failing records (1 for stale and gap)."""

    instrument_id: int
    check: Check
    start_ns: int
    end_ns: int | None
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class HealthState:
    """The health of one instrument now: healthy, or the checks that are failing."""

    healthy: bool
    reasons: tuple[Check, ...]


class HealthMonitor:
    """Counters, state and episodes of the health checks of one instrument.

    Both paths feed it through :meth:`observe` (record faults, in arrival order) and
    :meth:`silence` / :meth:`gap` (clock-based checks), so episodes are identical in replay
    and live for the same records.
    """

    def __init__(self, instrument_id: int, symbol: str) -> None:
        self.instrument_id = instrument_id
        self.symbol = symbol
        self.counters: dict[Check, int] = dict.fromkeys(Check, 0)
        self.episodes: list[HealthEpisode] = []
        self._open: dict[Check, HealthEpisode] = {}
        self._stale_start = -1

    @property
    def state(self) -> HealthState:
        reasons = tuple(c for c in Check if c in self._open)
        return HealthState(healthy=not reasons, reasons=reasons)

    def _start(self, check: Check, start_ns: int, count: int) -> HealthEpisode:
        episode = HealthEpisode(self.instrument_id, check, start_ns, None, count)
        self.episodes.append(episode)
        self._open[check] = episode
        log.warning(
            "%s (%d): health check '%s' failing since ts %d; not tradable",
            self.symbol,
            self.instrument_id,
            check,
            start_ns,
        )
        return episode

    def _end(self, check: Check, end_ns: int) -> None:
        episode = self._open.pop(check)
        episode.end_ns = end_ns
        log.info(
            "%s (%d): health check '%s' healthy again at ts %d after %d failure(s)",
            self.symbol,
            self.instrument_id,
            check,
            end_ns,
            episode.count,
        )

    def failing_records(self) -> bool:
        """Whether a record check has an open episode (it ends with the next healthy record)."""
        return bool(self._open) and any(check in self._open for check in _RECORD_CHECKS)

    def observe(self, ts_recv: np.ndarray, faults: np.ndarray) -> None:
        """Account the fault masks ``faults`` (uint8 ``(n,)``) of records received at
        ``ts_recv`` (UNIX ns ``(n,)``), in arrival order."""
        n = faults.shape[0]
        if n == 0:
            return
        seen = int(np.bitwise_or.reduce(faults))
        for check in _RECORD_CHECKS:
            if not (seen & check.bit) and check not in self._open:
                continue
            failing = (faults & check.bit) != 0
            self.counters[check] += int(np.count_nonzero(failing))
            was_open = check in self._open
            edges = np.flatnonzero(np.diff(failing.view(np.int8), prepend=np.int8(was_open)))
            open_at = 0  # a run of failures is contiguous: its count is its length
            for i in edges.tolist():
                if failing[i]:
                    self._start(check, int(ts_recv[i]), 0)
                    open_at = i
                else:
                    self._open[check].count += i - open_at
                    self._end(check, int(ts_recv[i]))
            if failing[-1]:
                self._open[check].count += n - open_at

    def silence(self, last_ns: int, until_ns: int | None, stale_ns: int) -> None:
        """Nothing came from ``last_ns`` until ``until_ns`` (the next record's ``ts_recv``), or
        ``None`` while nothing has come yet and the clock is past ``last_ns + stale_ns``.

        The stale episode starts at ``last_ns + stale_ns``; reporting the same silence again
        (the live clock first, the record later) only ends it."""
        start = last_ns + stale_ns
        if start != self._stale_start:
            self._stale_start = start
            self.counters[Check.STALE] += 1
            self._start(Check.STALE, start, 1)
        if until_ns is not None and Check.STALE in self._open:
            self._end(Check.STALE, until_ns)

    def gap(self, at_ns: int) -> None:
        """The transport reported missing records at ``at_ns``: open a gap episode (ended by the
        next record)."""
        if Check.GAP not in self._open:
            self.counters[Check.GAP] += 1
            self._start(Check.GAP, at_ns, 1)

    def gap_ended(self, at_ns: int) -> None:
        """A record arrived at ``at_ns`` after a transport gap: close the gap episode."""
        if Check.GAP in self._open:
            self._end(Check.GAP, at_ns)


_SMALL = 32
"""Up to this many records, per-batch checks run on Python lists (NumPy's per-call cost dominates)."""


def single_instrument(ids: np.ndarray) -> int | None:
    """The instrument id when every entry of ``ids`` (non-empty) is the same one, else ``None``."""
    if ids.shape[0] <= _SMALL:
        values = ids.tolist()
        return int(values[0]) if values.count(values[0]) == len(values) else None
    first = int(ids[0])
    return first if bool((ids == first).all()) else None


@dataclasses.dataclass(frozen=True, slots=True)
class TimeRegression:
    """What :meth:`ArrivalClock.observe` found in one batch for one instrument.

    ``opened`` episodes started in the batch (a run of records behind the clock is one episode);
    ``behind`` records of the batch were behind it; the first of them had ``ts_ns`` while the
    clock stood at ``clock_ns``; ``ongoing`` says whether an episode is still open after it."""

    instrument_id: int
    opened: int
    behind: int
    ts_ns: int
    clock_ns: int
    ongoing: bool


class ArrivalClock:
    """The ``time_backwards`` rule on arrival, per instrument: a record whose ``ts_recv`` is
    below the latest ``ts_recv`` of the instrument so far (:func:`clock_before_each`) is behind
    the clock. A run of such records is one episode, which ends with the first record at or
    after the clock. Nothing is dropped here: the features judge the same records again."""

    def __init__(self) -> None:
        self._clock: dict[int, int] = {}
        self._open: dict[int, int] = {}
        """instrument_id -> records behind so far, while its episode is open."""

    def observe(self, records: np.ndarray) -> list[TimeRegression]:
        """Advance the clocks over ``records`` (:data:`MBP10_DTYPE`, arrival order, any
        instruments); one :class:`TimeRegression` per instrument that had records behind."""
        ids = records["instrument_id"]
        if not len(ids):
            return []
        single = single_instrument(ids)
        if single is not None:  # the usual batch: one instrument's
            groups = [(single, records["ts_recv"])]
        else:
            groups = [(int(i), records["ts_recv"][ids == i]) for i in np.unique(ids)]
        found = []
        for instrument_id, ts in groups:
            regression = self._judge(instrument_id, ts)
            if regression is not None:
                found.append(regression)
        return found

    def _judge(self, instrument_id: int, ts_recv: np.ndarray) -> TimeRegression | None:
        clock = self._clock.get(instrument_id)
        if ts_recv.shape[0] <= _SMALL:  # a NATS message's few records: Python beats NumPy calls
            values = ts_recv.tolist()
            first, latest = values[0], max(values)
            ordered = all(a <= b for a, b in itertools.pairwise(values))
        else:
            first, latest = int(ts_recv[0]), int(ts_recv.max())
            ordered = bool((ts_recv[1:] >= ts_recv[:-1]).all())
        self._clock[instrument_id] = latest if clock is None else max(clock, latest)
        was_open = instrument_id in self._open
        if not was_open and ordered and (clock is None or first >= clock):
            return None
        ts = ts_recv.astype(np.int64)
        before = clock_before_each(ts, clock)
        behind = ts < before
        edges = np.flatnonzero(np.diff(behind.view(np.int8), prepend=np.int8(was_open)))
        opened = int(np.count_nonzero(behind[edges]))
        count = int(np.count_nonzero(behind))
        total = self._open.pop(instrument_id, 0) + count
        ongoing = bool(behind[-1])
        if ongoing:
            self._open[instrument_id] = total
        elif was_open or opened:
            log.info("instrument %d: ts_recv in order again after %d record(s) behind", instrument_id, total)
        if not count:
            return None
        first = int(np.argmax(behind))
        return TimeRegression(instrument_id, opened, count, int(ts[first]), int(before[first]), ongoing)
