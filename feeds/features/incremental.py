"""The incremental path (live): raw records pushed one at a time or in batches, bars as they close.

:class:`IncrementalBars` keeps one instrument's open bar: per record it unpacks the fields once
and updates the bar's :class:`~feeds.features.statistics.BarStatistics` in plain Python; the bars
that one call closes go through :func:`feeds.features.frame.bar_frames` together.
:class:`IncrementalFeatures` routes the records of several instruments.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from feeds.bars import BarClock, decision_times
from feeds.book import BookSnapshot, tick_fixed
from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.dbn.framing import mbp10_header_ok, take_mbp10
from feeds.errors import FeedError, UnknownInstrument
from feeds.features.frame import BarFrame, bar_frames
from feeds.features.record_fields import (
    ASK_SZS,
    ASKS,
    BID_SZS,
    BIDS,
    F_ACTION,
    F_ASK,
    F_BID,
    F_IID,
    F_LENGTH,
    F_PRICE,
    F_RTYPE,
    F_SEQ,
    F_SIDE,
    F_SIZE,
    F_TS,
    IID,
    RECORD,
    RECORD_SIZE,
)
from feeds.features.statistics import (
    BarStatistics,
    book_at_close,
    check_records,
    ofi_price_term,
    stale_interval_ns,
)
from feeds.health import HealthMonitor, PrevTop, fault_mask, record_faults, valid_top
from feeds.records import ACTION_TRADE, LEVELS, MBP10_RTYPE, SIDE_ASK, SIDE_BID, UNDEF_PRICE

__all__ = ["IncrementalBars", "IncrementalFeatures", "Run"]


def _layout(widths: Sequence[int]) -> list[slice]:
    """The columns of consecutive parts of a row, given their widths."""
    ends = list(itertools.accumulate(widths))
    return [slice(end - width, end) for end, width in zip(ends, widths, strict=True)]


_ARRAY_MASKS = 48
"""A pushed batch of at least this many records of one instrument gets its fault bits from the
array form of the record rules at once (:func:`feeds.health.record_faults`: ~100 us, mostly
NumPy's per-call costs); a smaller one from the scalar form, record by record (~2.2 us each).
Measured break-even: ~45 records."""

_ROW_PARTS = (
    ("close_ts", 1),
    ("close_ts_before", 1),
    ("mid2", 1),
    ("mid2_before", 1),
    ("signed_volume", 1),
    ("volume", 1),
    ("trades", 1),
    ("rv_half_ticks2", 1),
    ("n_records", 1),
    ("close_index", 1),
    ("tradable", 1),
    ("book_levels", 2 + 2 * LEVELS),  # the last healthy record's bid, ask, bid sizes, ask sizes
    ("end_sizes", 2 * LEVELS),  # bid sizes, ask sizes of the bar's last record
    ("ofi_corrections", LEVELS),  # the price-change corrections and excluded pairs of the bar
    ("closed_by", 1),  # the record that closed it: its index among the instrument's, -1 by the clock
    ("closer_ns", 1),  # that record's clock (running maximum of ts_recv); _NO_CLOSER by the clock
)
"""A closed bar waiting for its frame (:attr:`IncrementalBars.closed`), all ints, in this
order: its statistics (:class:`BarStatistics` names), the levels of the book at its close and
the sizes at its last record (the book and the order-flow imbalance of the bars one call closes
are computed from them together, as arrays), and the record whose arrival closed it
(:meth:`IncrementalFeatures.closing_runs` hands each bar over with that record, or at the
moment the clock closes it)."""
_ROW = dict(zip((name for name, _ in _ROW_PARTS), _layout([width for _, width in _ROW_PARTS]), strict=True))
_P = {name: at.start for name, at in _ROW.items()}  # the column of a one-int part
_NO_CLOSER = 2**62
"""The ``closer_ns`` of a bar closed by the clock (later than any record)."""


class IncrementalBars:
    """The incremental path for one instrument: push raw records one at a time, get the bars
    they close (the same bars and features as :func:`~feeds.features.compute_bars` on the same
    records).

    It lives with the features, not in :mod:`feeds.bars`: when bars close is
    :class:`feeds.bars.BarClock`'s rule, which this drives; what it keeps is the open bar's
    sufficient statistics and the health state of the feed, the live form of the vectorised
    path's carry (:class:`feeds.features.group_statistics.Carry`), and what it returns is features
    (:mod:`feeds.bars`, which both paths import, stays free of them).

    ``push`` takes the 368 raw bytes of one MBP-10 record (what a NATS message carries; from an
    array, :meth:`push_records`). Per record it unpacks the fields once and updates the open
    bar's statistics in plain Python with the shared definitions (the record rules,
    :func:`fault_mask` on one record, or :func:`feeds.health.record_faults` on a pushed batch at
    once; :func:`ofi_price_term`); a bar that closes leaves its statistics (integers) and the
    sizes of its last record and of its book, and the bars closed by one call become one
    :class:`BarFrame` through the array functions the vectorised path uses (:func:`book_at_close`,
    :func:`bar_frames`; the telescoped size change of the order flow as one array difference),
    so a batch of records pays NumPy's per-call costs once, not per bar. :meth:`poll` with the
    caller's clock (live) closes due time bars and opens stale episodes (a replay closes them
    with :meth:`close_on_clock`, the stale episodes being the records' to tell);
    :meth:`report_gap` takes a transport gap (the open bar is not tradable). Record-check
    episodes reach :attr:`monitor` when the bar closes (the decision point), stale and gap
    episodes at once.
    """

    def __init__(self, instrument: InstrumentSpec, bars: BarConfig, health: HealthConfig) -> None:
        self.spec = instrument
        self._health = health
        self._stale_ns = stale_interval_ns(health)
        self.tick = tick_fixed(instrument.tick_size)
        """The instrument's tick, fixed point."""
        self.bar_config = bars
        self._clock = BarClock(bars, self._stale_ns)
        self.monitor = HealthMonitor(instrument.instrument_id, instrument.symbol)
        self._n_seen = 0
        self._gap = False  # a gap was reported in the open bar
        self._gap_open = False  # the gap episode waits for the next record
        self._stale_open = False  # the clock found the feed stale; the next record ends it
        self._event_clock = bars.clock == "events"
        # the previous record, and its bid and ask prices
        self._last: tuple[Any, ...] | None = None
        self._bids: tuple[int, ...] = ()
        self._asks: tuple[int, ...] = ()
        self._last_ok = False
        # the last healthy record and the previous close
        self._healthy: tuple[Any, ...] | None = None
        self._book: tuple[int, ...] = (0,) * (_ROW["book_levels"].stop - _ROW["book_levels"].start)
        self._book_of: tuple[Any, ...] | None = None
        self._mid2 = 0
        self._half_ticks = 0
        self._close_mid2 = 0
        self._close_ts = 0
        self._close_index = -1
        self._end_sizes: tuple[int, ...] = (0,) * 2 * LEVELS  # at the previous bar's last record
        self._net_taken: np.ndarray = np.zeros(LEVELS, np.int64)  # bid - ask sizes, last bar taken
        self._closed: list[tuple[int, ...]] = []  # bars closed and not taken yet
        # while a batch's runs are handed out (IncrementalFeatures.closing_runs: show, show_last)
        self._shown: _Shown | None = None
        self._open_bar()

    def _open_bar(self) -> None:
        self._n_open = 0
        self._n_bad = 0
        self._signed = self._volume = self._trades = self._rv = 0
        self._ofi = [0] * LEVELS  # price-change corrections and excluded pairs
        self._ts: list[int] = []
        self._masks: list[int] = []

    @property
    def records_seen(self) -> int:
        return self._n_seen

    def book(self) -> BookSnapshot | None:
        """The current book (levels of the last record pushed), ``None`` before any record.
        While :meth:`IncrementalFeatures.closing_runs` hands out the runs of a batch pushed at
        once, the book as of the last record of the run handed out."""
        f = self.book_record
        if f is None:
            return None
        return BookSnapshot(
            instrument_id=self.spec.instrument_id,
            ts_recv=f[F_TS],
            bid_px=f[BIDS],
            ask_px=f[ASKS],
            bid_sz=f[BID_SZS],
            ask_sz=f[ASK_SZS],
        )

    @property
    def book_record(self) -> tuple[Any, ...] | None:
        """The record :meth:`book` shows, unpacked (``None`` before any record)."""
        shown = self._shown
        return self._last if shown is None else shown.record()

    def show(self, shown: _Shown) -> None:
        """Let :meth:`book` show the record that ``shown`` points at (an earlier record) until
        :meth:`show_last`."""
        self._shown = shown

    def show_last(self) -> None:
        """Let :meth:`book` show the last record pushed again."""
        self._shown = None

    def push(self, record: bytes | bytearray | memoryview) -> BarFrame | None:
        """Add one raw MBP-10 record of this instrument; return the bars it closes (or ``None``).

        Raises :class:`FeedError` for bytes that are not one MBP-10 record and
        :class:`UnknownInstrument` for another instrument's record.
        """
        if len(record) != RECORD_SIZE:
            raise FeedError(f"an MBP-10 record has {RECORD_SIZE} bytes, got {len(record)}")
        f = RECORD.unpack_from(record)
        if f[F_RTYPE] != MBP10_RTYPE or f[F_LENGTH] * 4 != RECORD_SIZE:
            raise FeedError(f"not an MBP-10 record (rtype {f[F_RTYPE]:#x}, length {f[F_LENGTH] * 4})")
        if f[F_IID] != self.spec.instrument_id:
            raise UnknownInstrument(f"record of instrument {f[F_IID]} pushed to {self.spec.symbol}")
        self.add_unpacked(f)
        return self.take_frame()

    def push_records(self, records: np.ndarray) -> list[BarFrame]:
        """:meth:`push` each record of ``records`` (this instrument only, arrival order); the bars
        they close, as one frame in close order (an empty list when none closed).

        Raises like :meth:`push`, before adding any record, when one record is not an MBP-10
        record of this instrument."""
        check_records(records)
        contiguous = np.ascontiguousarray(records)
        bad = ~mbp10_header_ok(contiguous) | (contiguous["instrument_id"] != self.spec.instrument_id)
        if bad.any():
            self.push(contiguous[int(np.argmax(bad))].tobytes())  # raises the error push() gives
        self.add_records(contiguous)
        return _take_frames([self])

    def add_records(self, records: np.ndarray) -> None:
        """:meth:`add_unpacked` each of ``records`` (contiguous, checked, this instrument's),
        keeping the bars they close in :attr:`closed`: their fault bits from the array
        form of the record rules at once, or record by record as :meth:`push` judges them when
        they are fewer than :data:`_ARRAY_MASKS`."""
        add = self.add_unpacked
        unpacked = RECORD.iter_unpack(records.data.cast("B"))
        if records.shape[0] < _ARRAY_MASKS:
            for f in unpacked:
                add(f)
            return
        for f, mask in zip(unpacked, self._masks_of(records), strict=True):
            add(f, mask)

    def would_close(self, records: int, latest_ts: int) -> bool:
        """Whether ``records`` more records, the latest received at ``latest_ts``, would close
        the open bar (:meth:`feeds.bars.BarClock.would_close`; a look-ahead that changes
        nothing)."""
        return self._clock.would_close(records, latest_ts)

    def poll(self, now_ns: int) -> BarFrame | None:
        """Judge the feed at the caller's clock ``now_ns`` (UNIX ns): open a stale episode when
        nothing came for ``stale_after_s`` and close the time bars due strictly before now."""
        clock = self._clock.clock_ts
        if self._last is not None and now_ns - clock > self._stale_ns:
            self._stale_open = True
            self.monitor.silence(clock, None, self._stale_ns)
        self.close_on_clock(now_ns)
        return self.take_frame()

    def close_on_clock(self, now_ns: int) -> None:
        """Close the time bars due strictly before ``now_ns`` (they wait in :attr:`closed`),
        without judging the feed stale (a replay's clock closes: the stale episodes are the
        records' to tell, as on the vectorised path)."""
        closes = self._clock.on_clock(now_ns)
        if closes:
            self._close(closes, self._clock.clock_ts, -1)

    @property
    def clock_ns(self) -> int:
        """The clock (running maximum of ``ts_recv``) of the last record, 0 before any."""
        return self._clock.clock_ts

    def take_frame(self) -> BarFrame | None:
        """The frame of the bars closed since the last call (``None`` when none)."""
        frames = _take_frames([self])
        return frames[0] if frames else None

    @property
    def closed(self) -> list[tuple[int, ...]]:
        """The bars closed and not taken yet, in close order, as rows of ints
        (:data:`_ROW_PARTS`); :func:`_take_frames` makes frames of them."""
        return self._closed

    def take_closed(self, net_last: np.ndarray) -> np.ndarray:
        """Mark the bars of :attr:`closed` taken. ``net_last`` is the bid minus the ask size per
        level at the last record of the last of them (int64 ``(LEVELS,)``), kept for the next
        call; returns the same at the bar before the first of them (the order flow telescopes
        from there)."""
        before = self._net_taken
        self._net_taken = net_last
        self._closed = []
        return before

    def report_gap(self, at_ns: int) -> None:
        """The transport lost records at ``at_ns``: the open bar is not tradable and a gap
        episode runs until the next record."""
        self._gap = self._gap_open = True
        self.monitor.gap(at_ns)

    def _mask(self, f: tuple[Any, ...]) -> int:
        """The record rules' fault bits of one unpacked record (the next one to add)."""
        last = self._last
        ts = f[F_TS]
        return int(
            fault_mask(
                bid=f[F_BID],
                ask=f[F_ASK],
                bid_sz=f[BID_SZS.start],
                ask_sz=f[ASK_SZS.start],
                trade_price=f[F_PRICE] if f[F_ACTION] == ACTION_TRADE else 1,
                ts=ts,
                clock_before=ts if last is None else self._clock.clock_ts,
                seq=f[F_SEQ],
                seq_before=f[F_SEQ] if last is None else last[F_SEQ],
                bid_before=UNDEF_PRICE if last is None else valid_top(last[F_BID]),
                ask_before=UNDEF_PRICE if last is None else valid_top(last[F_ASK]),
                tick=self.tick,
                config=self._health,
            )
        )

    def _masks_of(self, records: np.ndarray) -> list[int]:
        """The fault bits of ``records`` (contiguous, this instrument's, the next ones to add):
        the same rules over the batch at once (:func:`feeds.health.record_faults`), from the
        state the previous record left."""
        last = self._last
        prev = None
        if last is not None:
            prev = PrevTop(self._clock.clock_ts, last[F_SEQ], valid_top(last[F_BID]), valid_top(last[F_ASK]))
        bid = records["bid_px_00"].astype(np.int64)
        ask = records["ask_px_00"].astype(np.int64)
        masks: list[int] = record_faults(
            records, bid, ask, prev=prev, tick=self.tick, config=self._health
        ).tolist()
        return masks

    def add_unpacked(self, f: tuple[Any, ...], mask: int | None = None) -> None:
        """Add one record of this instrument unpacked with :data:`RECORD` (its header checked),
        with its fault bits (``None``: judged here, by the scalar form of the record rules):
        update the open bar; the bars it closes wait in :attr:`closed`."""
        if mask is None:
            mask = self._mask(f)
        ts = f[F_TS]
        last = self._last
        clock = self._clock
        clock_before = clock.clock_ts if last is not None else ts
        if self._stale_open or (last is not None and ts - clock_before > self._stale_ns):
            self._stale_open = False
            self.monitor.silence(clock_before, ts, self._stale_ns)
        if self._gap_open:
            self._gap_open = False
            self.monitor.gap_ended(ts)
        closes = clock.on_record(ts)
        if closes:
            self._close(closes, clock_before, self._n_seen)

        bids, asks = f[BIDS], f[ASKS]
        ok = mask == 0
        self._ts.append(ts)
        self._masks.append(mask)
        if last is None:  # the stream's first record starts the first bar's order flow
            self._end_sizes = f[BID_SZS] + f[ASK_SZS]
            self._net_taken = np.subtract(f[BID_SZS], f[ASK_SZS])
        elif not (ok and self._last_ok):  # a pair with an unhealthy record adds no flow
            self._no_flow(f, last)
        elif bids != self._bids or asks != self._asks:  # size changes at unchanged prices telescope
            self._price_terms(f, last)
        if f[F_ACTION] == ACTION_TRADE:
            self._add_trade(f)
        if ok:
            mid2 = bids[0] + asks[0]
            half_ticks = mid2 // self.tick
            if half_ticks > 0 and self._half_ticks > 0:
                step = half_ticks - self._half_ticks
                self._rv += step * step
            self._half_ticks = half_ticks
            self._mid2 = mid2
            self._healthy = f
        else:
            self._n_bad += 1
        self._last = f
        self._bids, self._asks = bids, asks
        self._last_ok = ok
        self._n_open += 1
        self._n_seen += 1
        if self._event_clock and clock.after_record():
            self._close([clock.clock_ts], clock.clock_ts, self._n_seen - 1)

    def _price_terms(self, f: tuple[Any, ...], last: tuple[Any, ...]) -> None:
        """Add the order flow of the levels whose price changed from ``last`` to ``f`` (both
        healthy)."""
        ofi = self._ofi
        bids, asks, pb, pa = f[BIDS], f[ASKS], self._bids, self._asks
        if bids != pb:
            q, pq = f[BID_SZS], last[BID_SZS]
            for k in range(LEVELS):
                if bids[k] != pb[k]:
                    ofi[k] += ofi_price_term(bids[k], pb[k], q[k], pq[k], bid=True)
        if asks != pa:
            q, pq = f[ASK_SZS], last[ASK_SZS]
            for k in range(LEVELS):
                if asks[k] != pa[k]:
                    ofi[k] += ofi_price_term(asks[k], pa[k], q[k], pq[k], bid=False)

    def _no_flow(self, f: tuple[Any, ...], last: tuple[Any, ...]) -> None:
        """Take back the size changes from ``last`` to ``f`` (one of them unhealthy), which the
        telescoped flow of the bar would otherwise count."""
        ofi = self._ofi
        bsz, asz, pqb, pqa = f[BID_SZS], f[ASK_SZS], last[BID_SZS], last[ASK_SZS]
        for k in range(LEVELS):
            ofi[k] -= (bsz[k] - pqb[k]) - (asz[k] - pqa[k])

    def _add_trade(self, f: tuple[Any, ...]) -> None:
        size = f[F_SIZE]
        self._trades += 1
        self._volume += size
        side = f[F_SIDE]
        if side == SIDE_BID:
            self._signed += size
        elif side == SIDE_ASK:
            self._signed -= size

    def _close(self, closes: Sequence[int], last_clock: int, closed_by: int) -> None:
        """Close the bars at ``closes``: the open bar (when it holds records) and empty bars;
        their rows (:data:`_ROW_PARTS`) wait in :attr:`closed`. ``last_clock`` is the
        clock of the last record before the close; ``closed_by`` the index of the record that
        closes them among this instrument's (-1: the caller's clock; the record closing them is
        the last one added, whose clock is the bars' ``closer_ns``)."""
        closer_ns = self._clock.clock_ts if closed_by >= 0 else _NO_CLOSER
        if self._masks and (self._n_bad or self.monitor.failing_records()):
            self.monitor.observe(np.array(self._ts, np.int64), np.array(self._masks, np.uint8))
        for j, close in enumerate(closes):
            n = self._n_open if j == 0 else 0
            if n:
                last = self._last
                assert last is not None
                self._end_sizes = last[BID_SZS] + last[ASK_SZS]
                self._close_index = self._n_seen - 1
                flow = (self._signed, self._volume, self._trades, self._rv)
                ofi = self._ofi
                healthy = self._healthy
                if healthy is not self._book_of and healthy is not None:
                    self._book_of = healthy
                    self._book = (healthy[F_BID], healthy[F_ASK], *healthy[BID_SZS], *healthy[ASK_SZS])
            else:
                ofi = [0] * LEVELS
                flow = (0, 0, 0, 0)
            tradable = (
                (self._n_bad == 0 or n == 0)
                and self._last_ok
                and self._healthy is not None
                and close - last_clock <= self._stale_ns
                and last_clock > 0
                and not (j == 0 and self._gap)
            )
            self._closed.append(
                (
                    close,
                    self._close_ts or close,
                    self._mid2,
                    self._close_mid2,
                    *flow,  # signed_volume, volume, trades, rv_half_ticks2
                    n,
                    self._close_index,
                    tradable,
                    *self._book,
                    *self._end_sizes,
                    *ofi,
                    closed_by,
                    closer_ns,
                )
            )
            self._close_mid2 = self._mid2
            self._close_ts = close
            if j == 0:
                self._gap = False
                self._open_bar()


def _take_frames(
    builders: Sequence[IncrementalBars], parts: Sequence[tuple[InstrumentSpec, int]] | None = None
) -> list[BarFrame]:
    """The frames of the bars that ``builders`` closed since they were last taken
    (:attr:`IncrementalBars.closed`), computed together (NumPy's per-call costs paid once per
    batch): one frame per builder that closed any, or one per part of ``parts`` (the closing
    builders' bars in order, each builder's split in runs: an instrument and its number of
    bars)."""
    closing = [b for b in builders if b.closed]
    if not closing:
        return []
    rows = np.array([row for b in closing for row in b.closed], np.int64)
    counts = [len(b.closed) for b in closing]
    # order-flow imbalance: the size change over the bar (telescoped) plus the corrections
    end = rows[:, _ROW["end_sizes"]]
    net = end[:, :LEVELS] - end[:, LEVELS:]
    net_before = np.empty_like(net)
    net_before[1:] = net[:-1]
    start = 0
    for builder, count in zip(closing, counts, strict=True):
        # each builder's first bar follows its own last one
        net_before[start] = builder.take_closed(net[start + count - 1])
        start += count
    ofi = net - net_before + rows[:, _ROW["ofi_corrections"]]
    levels = rows[:, _ROW["book_levels"]]
    ticks = [b.tick for b in closing]
    stats = BarStatistics(
        close_ts=rows[:, _P["close_ts"]].copy(),
        close_ts_before=rows[:, _P["close_ts_before"]],
        mid2=rows[:, _P["mid2"]],
        mid2_before=rows[:, _P["mid2_before"]],
        book=book_at_close(
            levels[:, 0], levels[:, 1], levels[:, 2 : 2 + LEVELS].T, levels[:, 2 + LEVELS :].T
        ),
        signed_volume=rows[:, _P["signed_volume"]],
        volume=rows[:, _P["volume"]],
        trades=rows[:, _P["trades"]],
        rv_half_ticks2=rows[:, _P["rv_half_ticks2"]],
        ofi=ofi,
        n_records=rows[:, _P["n_records"]].copy(),
        close_index=rows[:, _P["close_index"]].copy(),
        tradable=rows[:, _P["tradable"]] != 0,
        tick=ticks[0] if len(ticks) == 1 else np.repeat(ticks, counts),
    )
    if parts is None:
        parts = [(b.spec, count) for b, count in zip(closing, counts, strict=True)]
    return bar_frames(parts, stats)


class _Shown:
    """The record that :meth:`IncrementalBars.book` shows while
    :meth:`IncrementalFeatures.closing_runs` hands out the runs of a batch: the instrument's
    last record at or before the end of the run out (:attr:`end`, an index into the batch, the
    one value that changes per run), unpacked when asked for."""

    __slots__ = ("before", "end", "places", "raw")

    def __init__(self, raw: memoryview, places: list[int], before: tuple[Any, ...] | None) -> None:
        self.raw = raw
        self.places = places  # where the instrument's records are in the batch, ascending
        self.before = before  # its last record before the batch
        self.end = -1

    def record(self) -> tuple[Any, ...] | None:
        j = bisect.bisect_right(self.places, self.end) - 1
        return self.before if j < 0 else RECORD.unpack_from(self.raw, self.places[j] * RECORD_SIZE)


class Run(NamedTuple):
    """One step of a replay (:meth:`IncrementalFeatures.closing_runs`)."""

    records: np.ndarray
    """The records that reach the book before the decision (possibly none)."""
    frames: tuple[BarFrame, ...]
    """The bars decided then, one frame an instrument (its bars in close order): the one
    instrument's that a record closed, or every quiet instrument's the clock closed at that
    moment (in the configured order); none: records only."""
    decided_ns: int
    """The moment, on the feed clock, of the decision (:func:`feeds.bars.decision_times`): its
    orders are placed then."""
    on_clock: bool
    """The clock decides the bars, not a record: the feed clock moved to ``decided_ns`` without
    one (the paper book's clock moves with it)."""


class IncrementalFeatures:
    """:class:`IncrementalBars` for several instruments: routes raw records by instrument id.

    Records of an instrument that is not configured, or bytes that are not an MBP-10 record,
    are counted in :attr:`rejected` and dropped (never raised, never passed on).
    """

    def __init__(self, instruments: Iterable[InstrumentSpec], bars: BarConfig, health: HealthConfig) -> None:
        self.by_id: dict[int, IncrementalBars] = {
            spec.instrument_id: IncrementalBars(spec, bars, health) for spec in instruments
        }
        self._ids = np.array(sorted(self.by_id), np.uint32)
        self.rejected = 0

    def push(self, record: bytes | bytearray | memoryview) -> BarFrame | None:
        """Route one raw record; return the bars it closes for its instrument (or ``None``)."""
        if len(record) != RECORD_SIZE:
            self.rejected += 1
            return None
        builder = self.by_id.get(IID.unpack_from(record)[0])
        if builder is None:
            self.rejected += 1
            return None
        try:
            return builder.push(record)
        except FeedError:
            self.rejected += 1
            return None

    def push_records(self, records: np.ndarray) -> list[BarFrame]:
        """Route every record of ``records`` (any instruments, arrival order); the bars they
        close, one frame per instrument that closed any (bars in close order)."""
        check_records(records)
        self._route(np.ascontiguousarray(records))
        return _take_frames(list(self.by_id.values()))

    def closing_runs(self, records: np.ndarray, *, grace_ns: int) -> Iterator[Run]:
        """``records`` (any instruments, arrival order) pushed as one array
        (:meth:`push_records`), handed back as a replay on the feed clock meets them: each
        :class:`Run` of records up to the moment bars are decided, with the bars decided then
        (one instrument's, in close order) and that moment; then the records left (frame
        ``None``).

        A bar is decided when the daemon's intake closes it (:func:`feeds.bars.decision_times`,
        ``grace_ns`` = ``daemon.close_grace_ns``): at the record that closes it, or, for a time
        bar whose instrument is quiet past the grace, on the clock, after the last record
        (of any instrument) stamped before that moment. The bars the clock closes at one moment
        (every quiet instrument's, a grace past one boundary) are one run, decided together as
        the live daemon decides them (:meth:`agent.daemon.intake.Intake._close_due`); a run may
        then hold no record. The time bars due by the clock of the batch's last record are
        closed here; those due later wait for the next batch (the end of the data closes none).

        While a run is out, each instrument's :meth:`IncrementalBars.book` is its book as of the
        run's last record, so a caller that decides the bars before taking the next run sees
        what it would see pushing record by record: the same runs, bars and books, with
        NumPy's per-call costs paid once per batch instead of once per bar. The features (and
        their health episodes) are those of the whole batch from the first run on."""
        check_records(records)
        contiguous = np.ascontiguousarray(records)
        builders = list(self.by_id.values())
        before = [(b.records_seen, b.book_record) for b in builders]
        feed_before = max((b.clock_ns for b in builders), default=0)
        ids, good = self._route(contiguous)
        feed_ns = max((b.clock_ns for b in builders), default=0)
        for builder in builders:  # the bars whose time is up by the batch's last record
            builder.close_on_clock(feed_ns - grace_ns)
        # the feed clock at each record of the batch (its configured instruments' records)
        clock = np.where(good, contiguous["ts_recv"], 0).astype(np.int64)
        np.maximum.accumulate(np.maximum(clock, feed_before), out=clock)
        # where each builder's records are in the batch
        places = {
            b: (np.flatnonzero(good & (ids == b.spec.instrument_id)), seen, last)
            for b, (seen, last) in zip(builders, before, strict=True)
            if b.records_seen > seen
        }
        # each run: its last record in the batch, its moment, whether by the clock; its
        # instrument and number of bars
        keys: list[tuple[int, int, bool]] = []
        parts: list[tuple[InstrumentSpec, int]] = []
        for builder in builders:
            if not builder.closed:
                continue
            rows = np.array([row[_P["close_ts"] : _P["closer_ns"] + 1] for row in builder.closed], np.int64)
            close_ts, closed_by, closer = rows[:, 0], rows[:, -2], rows[:, -1]
            decided = decision_times(closer, close_ts, builder.bar_config, grace_ns)
            ends = np.searchsorted(clock, decided, side="left") - 1  # by the clock
            by_record = decided == closer
            if by_record.any():
                at, seen, _ = places[builder]
                ends[by_record] = at[closed_by[by_record] - seen]
            # a run: the consecutive bars decided at one moment by one closer
            starts = np.flatnonzero(np.diff(decided, prepend=-1) | np.diff(closed_by, prepend=-2))
            keys.extend(
                zip(
                    ends[starts].tolist(),
                    decided[starts].tolist(),
                    (~by_record[starts]).tolist(),
                    strict=True,
                )
            )
            parts.extend((builder.spec, n) for n in np.diff(starts, append=len(rows)).tolist())
        frames = _take_frames(builders, parts)
        raw = contiguous.data.cast("B")
        showing = [(b, _Shown(raw, at.tolist(), last)) for b, (at, _, last) in places.items()]
        start = 0
        try:
            for builder, shown in showing:
                builder.show(shown)
            # runs of one key are the clock's closes at one moment (a record closes one
            # instrument's bars): one run, its frames in the builders' order (the sort is stable)
            for (end, decided_ns, on_clock), runs in itertools.groupby(
                sorted(range(len(keys)), key=keys.__getitem__), key=keys.__getitem__
            ):
                for _, shown in showing:
                    shown.end = end
                yield Run(records[start : end + 1], tuple(frames[run] for run in runs), decided_ns, on_clock)
                start = max(start, end + 1)
        finally:
            for builder, _ in showing:
                builder.show_last()
        if start < records.shape[0]:
            yield Run(records[start:], (), int(clock[-1]), False)

    def _route(self, contiguous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add every MBP-10 record of a configured instrument in ``contiguous`` (an array of
        records, arrival order) to its builder and count the others in :attr:`rejected`;
        returns the instrument id of each record and whether it was added."""
        ids = contiguous["instrument_id"]
        known = (ids[:, None] == self._ids).any(axis=1)  # np.isin is 3x slower on a batch
        good = mbp10_header_ok(contiguous) & known
        routed, routed_ids = contiguous, ids
        if not good.all():
            self.rejected += int(good.shape[0] - np.count_nonzero(good))
            routed = take_mbp10(contiguous, good)
            routed_ids = routed["instrument_id"]
        if not len(routed_ids):
            return ids, good
        by_id = self.by_id
        if len(routed_ids) < _ARRAY_MASKS * len(by_id):  # a few records per instrument: route each one
            for f in RECORD.iter_unpack(routed.data.cast("B")):
                by_id[f[F_IID]].add_unpacked(f)
        else:
            for iid, builder in by_id.items():  # instruments are independent: one at a time
                mine = routed_ids == iid
                if mine.all():
                    builder.add_records(routed)
                elif mine.any():
                    builder.add_records(take_mbp10(routed, mine))
        return ids, good

    def closing(self, records: np.ndarray, pending: collections.Counter[int]) -> list[int]:
        """The instruments whose open bar :meth:`push_records` of ``records`` would close, after
        the records not pushed yet that ``pending`` counts per instrument id (this call adds
        ``records`` to it). A look-ahead that changes nothing: the daemon ends a run with the
        batches that close bars, so that their decisions wait for no batch behind them."""
        ids = records["instrument_id"]
        if not len(ids):
            return []
        ts = records["ts_recv"]
        first = int(ids[0])
        if (ids == first).all():  # the usual batch: one instrument's
            groups = [(first, len(ids), int(ts.max()))]
        else:
            groups = [
                (int(i), int(np.count_nonzero(ids == i)), int(ts[ids == i].max())) for i in np.unique(ids)
            ]
        out = []
        for iid, n, latest in groups:
            builder = self.by_id.get(iid)
            if builder is not None:
                pending[iid] += n
                if builder.would_close(pending[iid], latest):
                    out.append(iid)
        return out

    def poll(self, now_ns: int) -> list[BarFrame]:
        """:meth:`IncrementalBars.poll` for every instrument; the frames that closed."""
        out = []
        for builder in self.by_id.values():
            frame = builder.poll(now_ns)
            if frame is not None:
                out.append(frame)
        return out
