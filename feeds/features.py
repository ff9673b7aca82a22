"""Causal bar features per instrument: one kernel, a vectorised and an incremental path.

:func:`compute_bars` runs the kernel once over all records of an instrument (replay, training);
:class:`IncrementalBars` buffers the raw records of the open bar and runs *the same kernel* on
them when the bar closes (live), carrying the little state a bar needs from the one before
(:class:`_Carry`). The features of a bar are therefore the same numbers on both paths
(tests/feeds/test_features_parity.py checks them bit for bit).

Causality: the features of the bar closing at ``close(t)`` use only the records in
``(close(t-1), close(t)]`` (see :mod:`feeds.bars`) and the book at ``close(t)`` (the levels of
the instrument's last healthy record at or before the close). A bar with no record carries the
book forward: book features repeat, flow features are 0.

Health: records that fail a record check (:mod:`feeds.health`) never feed the maths as valid:
the mid used for returns and realised variance is that of the last healthy record, an order-flow
term needs the record and the one before it healthy, and the book at close is the last healthy
book. A bar is ``tradable`` only when none of its records failed a check, the last record is
healthy, the feed was not stale at the close and no transport gap was reported in the bar.

Units: prices become ticks with the instrument's ``tick_size``; sizes are contracts; times ns.
NaN never appears: every ratio has a defined value for an empty denominator (0).

The model's input is these ``F = len(FEATURE_NAMES)`` market features plus 2 agent features
(the agent's position and unrealised P&L) that the agent appends at decision time; they are
not computed here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
from collections.abc import Iterable, Sequence

import numpy as np

from feeds.bars import BarClock, BarPlan, plan_bars
from feeds.book import BOOK_COLUMNS, BookSnapshot, book_columns, level_arrays, tick_fixed
from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.errors import FeedError, UnknownInstrument
from feeds.health import RECORD_FAULTS, HealthMonitor, PrevTop, prev_top_of, record_faults
from feeds.records import ACTION_TRADE, LEVELS, MBP10_DTYPE, MBP10_RTYPE, SIDE_ASK, SIDE_BID, UNDEF_PRICE

__all__ = [
    "FEATURE_NAMES",
    "BarFrame",
    "FeatureSet",
    "IncrementalBars",
    "IncrementalFeatures",
    "compute_all",
    "compute_bars",
]

FEATURE_NAMES: tuple[str, ...] = (
    "mid_logret",  # log(mid(close t) / mid(close t-1)), 0 for the first bar
    "mid_change_ticks",  # (mid(close t) - mid(close t-1)) / tick
    "spread_ticks",  # book at close
    "microprice_offset_ticks",
    "depth_imbalance_l1",
    "depth_imbalance_l3",
    "depth_imbalance_l5",
    "depth_imbalance_l10",
    *(f"ofi_l{m}" for m in range(1, LEVELS + 1)),  # contracts, summed over the bar
    "ofi_total",  # sum of the 10 levels
    "trade_volume_signed",  # contracts, + buyer-initiated, - seller-initiated
    "trade_volume",  # contracts
    "trade_count",
    "realized_var",  # sum of squared record-to-record mid log-returns in the bar
    "update_count",  # records in the bar
    "log_depth_bid_l10",  # log1p(contracts on the 10 bid levels), book at close
    "log_depth_ask_l10",
    "bar_seconds",  # time since the previous close, s (0 for the first bar)
    "tod_sin",  # time of day of the close (UTC), sin(2 pi s / 86400)
    "tod_cos",
)
_F = len(FEATURE_NAMES)
_COL = {name: i for i, name in enumerate(FEATURE_NAMES)}
_BOOK = {name: i for i, name in enumerate(BOOK_COLUMNS)}
_BOOK_TO_FEATURE = [
    (_BOOK[name], _COL[name])
    for name in (
        "spread_ticks",
        "microprice_offset_ticks",
        "depth_imbalance_l1",
        "depth_imbalance_l3",
        "depth_imbalance_l5",
        "depth_imbalance_l10",
        "log_depth_bid_l10",
        "log_depth_ask_l10",
    )
]
_DAY_NS = 86_400 * 1_000_000_000
_TWO_PI = 2.0 * math.pi


@dataclasses.dataclass(frozen=True, slots=True)
class BarFrame:
    """The closed bars of one instrument, ``n`` rows in close order.

    ``features`` is float32 ``(n, F)`` with columns :data:`FEATURE_NAMES`; every other array
    is ``(n,)``. Book values are those of the last healthy book at the close (0 when none yet).
    ``close_index`` is the index of the instrument's last record at or before the close: into the
    array given to :func:`compute_bars`/:func:`compute_all`, or the count of records pushed
    before it for the incremental path (-1 when none).
    """

    instrument_id: int
    symbol: str
    ts_close: np.ndarray  # int64 UNIX ns
    features: np.ndarray  # float32 (n, F)
    mid_ticks: np.ndarray  # float64, mid / tick_size
    mid_price: np.ndarray  # float64, price units
    spread_ticks: np.ndarray  # float64
    bid_price: np.ndarray  # float64, price units
    ask_price: np.ndarray  # float64, price units
    bid_size: np.ndarray  # int64, contracts at the best bid
    ask_size: np.ndarray  # int64, contracts at the best ask
    close_index: np.ndarray  # int64
    n_records: np.ndarray  # int64, records in the bar
    tradable: np.ndarray  # bool

    def __len__(self) -> int:
        return int(self.ts_close.shape[0])

    @classmethod
    def empty(cls, instrument_id: int, symbol: str) -> BarFrame:
        """A frame with no bar."""
        f8 = np.zeros(0, np.float64)
        i8 = np.zeros(0, np.int64)
        return cls(
            instrument_id,
            symbol,
            i8,
            np.zeros((0, _F), np.float32),
            f8,
            f8,
            f8,
            f8,
            f8,
            i8,
            i8,
            i8,
            i8,
            np.zeros(0, bool),
        )

    @classmethod
    def concat(cls, frames: Sequence[BarFrame]) -> BarFrame:
        """The bars of ``frames`` (same instrument, in order) in one frame."""
        if not frames:
            raise ValueError("concat needs at least one frame")
        first = frames[0]
        arrays = {
            f.name: np.concatenate([getattr(fr, f.name) for fr in frames])
            for f in dataclasses.fields(cls)
            if f.name not in ("instrument_id", "symbol")
        }
        return cls(instrument_id=first.instrument_id, symbol=first.symbol, **arrays)


@dataclasses.dataclass(slots=True)
class _Carry:
    """State handed from one kernel call to the next (all from records before the call)."""

    prev: PrevTop | None = None  # health rules
    last_words: np.ndarray | None = None  # the last record as int64 words, (_WORDS,)
    last_ok: bool = False  # last record healthy
    last_clock: int = 0  # clock (max ts_recv) of the last record, 0 = none
    last_index: int = -1
    book: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(BOOK_COLUMNS)))
    has_book: bool = False
    mid: float = 0.0  # fixed-point mid of the last healthy record, 0 = none
    close_mid: float = 0.0  # the same at the previous close
    close_ts: int = 0  # previous close, 0 = none


def _bar_sums(x: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per-bar sums of ``x`` (``(n,)`` or ``(n, k)``) over ``[starts[j], ends[j])``; 0 for
    empty bars. Bars are contiguous, so the non-empty ones tile ``x[:ends[-1]]``."""
    out = np.zeros((starts.shape[0], *x.shape[1:]), dtype=x.dtype)
    nonempty = ends > starts
    if nonempty.any():
        out[nonempty] = np.add.reduceat(x, starts[nonempty], axis=0)
    return out


def _log_ratio(cur: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """``log(cur / prev)`` where both are positive, else 0 (float64)."""
    ok = (cur > 0) & (prev > 0)
    return np.log(np.where(ok, cur, 1.0) / np.where(ok, prev, 1.0))


_WORDS = MBP10_DTYPE.itemsize // 8  # a record as int64 words
_LEVEL_WORD = MBP10_DTYPE.fields["bid_px_00"][1] // 8  # type: ignore[index]
_BID_PX = _LEVEL_WORD + 4 * np.arange(LEVELS)  # word of level k's bid price
_ASK_PX = _BID_PX + 1
_SIZES = _BID_PX + 2  # bid size in the low 32 bits, ask size in the high 32 bits
_LOW32 = np.int64(0xFFFFFFFF)


def _prev_words(
    words: np.ndarray, carried: np.ndarray | None, rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """``words[rows - 1, cols]``, with row -1 the carried record (row 0 itself when none)."""
    out: np.ndarray = words[np.maximum(rows - 1, 0), cols]
    if carried is not None:
        first = rows == 0
        out[first] = carried[cols[first]]
    return out


def _bar_ofi(
    words: np.ndarray, carried: np.ndarray | None, pair_ok: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """Multi-level order-flow imbalance per bar and level, int64 ``(n_bars, LEVELS)``, contracts.

    Per record ``i`` and level ``m`` (Cont, Kukanov and Stoikov 2014; Xu, Gould and Howison 2018),
    with ``b, qb`` the bid price and size at level ``m`` and ``a, qa`` the ask:

        e_i = qb_i 1[b_i >= b_i-1] - qb_i-1 1[b_i <= b_i-1]
              - qa_i 1[a_i <= a_i-1] + qa_i-1 1[a_i >= a_i-1]

    summed over the records of the bar; an empty bid level counts as the lowest price, an empty
    ask level (``UNDEF_PRICE``) as the highest. Record ``i - 1`` of the first record is the
    carried record (``carried``, the previous record as int64 words) or, at the start of the
    stream, the record itself (no flow). A pair with an unhealthy record (``pair_ok`` false)
    contributes nothing.

    Computed without a dense pass over sizes: where prices are unchanged ``e`` is the size
    change, which telescopes over a bar to (size at the bar's last record - size at the previous
    bar's last record); the records where a level's price changed (sparse) and the excluded
    pairs are corrected exactly. All in integers: the result does not depend on how records are
    grouped into calls.
    """
    n = words.shape[0]
    n_bars = ends.shape[0]
    first = carried if carried is not None else words[0]
    last = ends - 1
    size_end = np.where((last >= 0)[:, None], words[np.maximum(last, 0)][:, _SIZES], first[_SIZES])
    size_prev = np.empty_like(size_end)
    size_prev[0] = first[_SIZES]
    size_prev[1:] = size_end[:-1]
    ofi: np.ndarray = ((size_end & _LOW32) - (size_prev & _LOW32)) - ((size_end >> 32) - (size_prev >> 32))

    bars: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for cols, is_bid in ((_BID_PX, True), (_ASK_PX, False)):
        px = words[:, cols[0] : cols[-1] + 1 : 4].copy()
        flat = np.flatnonzero(px[1:] != px[:-1])
        rows, lev = flat // LEVELS + 1, flat % LEVELS
        if carried is not None:
            lev0 = np.flatnonzero(px[0] != carried[cols])
            rows = np.concatenate((np.zeros(lev0.shape[0], rows.dtype), rows))
            lev = np.concatenate((lev0, lev))
        keep = pair_ok[rows]
        rows, lev = rows[keep], lev[keep]
        p1 = px[rows, lev]
        p0 = _prev_words(words, carried, rows, cols[lev])
        s1 = words[rows, _SIZES[lev]]
        s0 = _prev_words(words, carried, rows, _SIZES[lev])
        if is_bid:
            p1 = np.where(p1 == UNDEF_PRICE, -1, p1)
            p0 = np.where(p0 == UNDEF_PRICE, -1, p0)
            val = np.where(p1 > p0, s0 & _LOW32, 0) - np.where(p1 < p0, s1 & _LOW32, 0)
        else:
            val = np.where(p1 > p0, s1 >> 32, 0) - np.where(p1 < p0, s0 >> 32, 0)
        bars.append(np.searchsorted(ends, rows, side="right"))
        levels.append(lev)
        values.append(val)
    bad = np.flatnonzero(~pair_ok)
    if bad.shape[0]:
        now = words[bad][:, _SIZES]
        before = np.stack([_prev_words(words, carried, np.full(LEVELS, i), _SIZES) for i in bad.tolist()])
        change = ((now & _LOW32) - (before & _LOW32)) - ((now >> 32) - (before >> 32))
        bars.append(np.repeat(np.searchsorted(ends, bad, side="right"), LEVELS))
        levels.append(np.tile(np.arange(LEVELS), bad.shape[0]))
        values.append(-change.ravel())
    flat = np.concatenate(bars) * LEVELS + np.concatenate(levels)
    if flat.shape[0] and n:
        sums = np.bincount(flat, weights=np.concatenate(values), minlength=n_bars * LEVELS)
        ofi += sums.astype(np.int64).reshape(n_bars, LEVELS)
    return ofi


def _kernel(
    records: np.ndarray,
    plan: BarPlan,
    carry: _Carry,
    *,
    spec: InstrumentSpec,
    health: HealthConfig,
    monitor: HealthMonitor,
    index_base: np.ndarray | int,
    blocked_first: bool = False,
) -> tuple[BarFrame, _Carry]:
    """Features of the bars of ``plan`` over ``records`` (one instrument, exactly the records of
    those bars, in arrival order). ``index_base`` maps local record indices to ``close_index``
    (an int offset or an int64 ``(n,)`` position array). ``blocked_first`` marks the first bar
    not tradable (a transport gap). Returns the frame and the carry for the next call."""
    tick = tick_fixed(spec.tick_size)
    stale_ns = round(health.stale_after_s * 1e9)
    n = records.shape[0]
    ends = plan.ends
    n_bars = ends.shape[0]
    starts = np.empty_like(ends)
    if n_bars:
        starts[0] = 0
        starts[1:] = ends[:-1]

    if n:
        lv = level_arrays(records)
        bid = np.ascontiguousarray(lv.bid_px[:, 0])
        ask = np.ascontiguousarray(lv.ask_px[:, 0])
        faults = record_faults(records, bid, ask, prev=carry.prev, tick=tick, config=health)
        ts = records["ts_recv"].astype(np.int64)
        clock = np.maximum.accumulate(np.maximum(ts, carry.last_clock))
        # stale silences between records (replay clock = the records' own ts_recv)
        prev_clock = np.empty(n, np.int64)
        prev_clock[0] = carry.last_clock
        prev_clock[1:] = clock[:-1]
        silent = np.flatnonzero((ts - prev_clock > stale_ns) & (prev_clock > 0))
        for i in silent.tolist():
            monitor.silence(int(prev_clock[i]), int(ts[i]), stale_ns)
        monitor.observe(ts, faults)
        ok = (faults & RECORD_FAULTS) == 0

        words = records.view(np.int64).reshape(n, _WORDS)
        pair_ok = ok.copy()
        pair_ok[1:] &= ok[:-1]
        pair_ok[0] &= carry.last_ok or carry.last_words is None
        ofi = _bar_ofi(words, carry.last_words, pair_ok, ends)

        # trades: action T, side = aggressor
        is_trade = records["action"] == ACTION_TRADE
        side = records["side"]
        size = records["size"].astype(np.int64)
        signed = np.where(is_trade & (side == SIDE_BID), size, 0) - np.where(
            is_trade & (side == SIDE_ASK), size, 0
        )
        flows_i = np.stack((signed, np.where(is_trade, size, 0), is_trade.astype(np.int64), ~ok), axis=1)
        flows = _bar_sums(flows_i.astype(np.int64), starts, ends)

        # mid of the last healthy record, record by record
        mid = (bid.astype(np.float64) + ask.astype(np.float64)) * 0.5
        last_ok_idx = np.maximum.accumulate(np.where(ok, np.arange(n), -1))
        mid_h = np.where(last_ok_idx >= 0, mid[np.maximum(last_ok_idx, 0)], carry.mid)
        prev_mid = np.empty(n)
        prev_mid[0] = carry.mid
        prev_mid[1:] = mid_h[:-1]
        r = _log_ratio(mid_h, prev_mid)
        rv = _bar_sums(r * r, starts, ends)
    else:
        ofi = np.zeros((n_bars, LEVELS), np.int64)
        flows = np.zeros((n_bars, 4), np.int64)
        rv = np.zeros(n_bars)

    # the book at each close: last healthy record at or before it, else carried
    last = ends - 1
    has_rec = last >= 0
    book = np.broadcast_to(carry.book, (n_bars, len(BOOK_COLUMNS))).copy()
    close_mid = np.full(n_bars, carry.mid)
    has_book = np.full(n_bars, carry.has_book)
    last_ok_bar = np.full(n_bars, carry.last_ok)
    last_clock = np.full(n_bars, carry.last_clock, np.int64)
    if n:
        h = np.where(has_rec, last_ok_idx[np.maximum(last, 0)], -1)
        with_book = h >= 0
        book[with_book] = book_columns(lv, h[with_book], tick)
        close_mid[with_book] = mid[h[with_book]]
        has_book |= with_book
        last_ok_bar[has_rec] = ok[last[has_rec]]
        last_clock[has_rec] = clock[last[has_rec]]
    prev_close_mid = np.empty(n_bars)
    if n_bars:
        prev_close_mid[0] = carry.close_mid
        prev_close_mid[1:] = close_mid[:-1]

    close_ts = plan.close_ts.astype(np.int64)
    prev_close_ts = np.empty(n_bars, np.int64)
    if n_bars:
        prev_close_ts[0] = carry.close_ts or close_ts[0]
        prev_close_ts[1:] = close_ts[:-1]

    feats = np.zeros((n_bars, _F), np.float64)
    feats[:, _COL["mid_logret"]] = _log_ratio(close_mid, prev_close_mid)
    both = (close_mid > 0) & (prev_close_mid > 0)
    feats[:, _COL["mid_change_ticks"]] = np.where(both, close_mid - prev_close_mid, 0.0) / tick
    for src, dst in _BOOK_TO_FEATURE:
        feats[:, dst] = book[:, src]
    ofi_col = _COL["ofi_l1"]
    feats[:, ofi_col : ofi_col + LEVELS] = ofi
    feats[:, _COL["ofi_total"]] = ofi.sum(axis=1)
    feats[:, _COL["trade_volume_signed"]] = flows[:, 0]
    feats[:, _COL["trade_volume"]] = flows[:, 1]
    feats[:, _COL["trade_count"]] = flows[:, 2]
    feats[:, _COL["realized_var"]] = rv
    n_records = ends - starts
    feats[:, _COL["update_count"]] = n_records
    feats[:, _COL["bar_seconds"]] = (close_ts - prev_close_ts) / 1e9
    angle = (close_ts % _DAY_NS) * (_TWO_PI / _DAY_NS)
    feats[:, _COL["tod_sin"]] = np.sin(angle)
    feats[:, _COL["tod_cos"]] = np.cos(angle)

    tradable = (flows[:, 3] == 0) & last_ok_bar & has_book & (close_ts - last_clock <= stale_ns)
    tradable &= last_clock > 0
    if blocked_first and n_bars:
        tradable[0] = False

    if isinstance(index_base, np.ndarray):
        close_index = np.where(has_rec, index_base[np.maximum(last, 0)], carry.last_index)
    else:
        close_index = np.where(has_rec, last + index_base, carry.last_index)

    frame = BarFrame(
        instrument_id=spec.instrument_id,
        symbol=spec.symbol,
        ts_close=close_ts,
        features=feats.astype(np.float32),
        mid_ticks=book[:, _BOOK["mid_ticks"]].copy(),
        mid_price=book[:, _BOOK["mid_price"]].copy(),
        spread_ticks=book[:, _BOOK["spread_ticks"]].copy(),
        bid_price=book[:, _BOOK["bid_price"]].copy(),
        ask_price=book[:, _BOOK["ask_price"]].copy(),
        bid_size=book[:, _BOOK["bid_size"]].astype(np.int64),
        ask_size=book[:, _BOOK["ask_size"]].astype(np.int64),
        close_index=close_index.astype(np.int64),
        n_records=n_records.astype(np.int64),
        tradable=tradable,
    )
    if n_bars == 0:
        return frame, carry
    nxt = _Carry(
        prev=carry.prev,
        last_words=carry.last_words,
        last_ok=bool(last_ok_bar[-1]),
        last_clock=int(last_clock[-1]),
        last_index=int(close_index[-1]),
        book=book[-1].copy(),
        has_book=bool(has_book[-1]),
        mid=float(close_mid[-1]),
        close_mid=float(close_mid[-1]),
        close_ts=int(close_ts[-1]),
    )
    if n:
        nxt.prev = prev_top_of(records, bid, ask, carry.prev)
        nxt.last_words = words[-1].copy()
    return frame, nxt


def _check_records(records: np.ndarray) -> None:
    if not isinstance(records, np.ndarray) or records.dtype != MBP10_DTYPE or records.ndim != 1:
        raise FeedError("expected a 1-D array of MBP-10 records (feeds.records.MBP10_DTYPE)")


def _stale_ns(health: HealthConfig) -> int:
    if not health.stale_after_s > 0:
        raise FeedError(f"feeds.health.stale_after_s must be positive, got {health.stale_after_s!r}")
    return round(health.stale_after_s * 1e9)


_CHUNK_RECORDS = 1 << 13
"""The vectorised path runs the kernel over groups of whole bars of about this many records:
small temporaries stay in cache and are reused, and the carry makes the grouping invisible."""


def _compute(
    records: np.ndarray,
    positions: np.ndarray | int,
    *,
    spec: InstrumentSpec,
    bars: BarConfig,
    health: HealthConfig,
    monitor: HealthMonitor,
) -> BarFrame:
    stale_ns = _stale_ns(health)
    clock = (
        np.maximum.accumulate(records["ts_recv"].astype(np.int64)) if len(records) else np.zeros(0, np.int64)
    )
    plan = plan_bars(clock, bars, stale_ns)
    n_bars = plan.ends.shape[0]
    if n_bars == 0:
        return BarFrame.empty(spec.instrument_id, spec.symbol)
    targets = np.arange(_CHUNK_RECORDS, int(plan.ends[-1]), _CHUNK_RECORDS)
    cuts = np.unique(np.searchsorted(plan.ends, targets, side="left") + 1)
    bounds = [0, *cuts[cuts < n_bars].tolist(), n_bars]
    carry = _Carry()
    frames = []
    for b0, b1 in itertools.pairwise(bounds):
        r0 = int(plan.ends[b0 - 1]) if b0 else 0
        r1 = int(plan.ends[b1 - 1])
        part = BarPlan(ends=plan.ends[b0:b1] - r0, close_ts=plan.close_ts[b0:b1])
        base = positions[r0:r1] if isinstance(positions, np.ndarray) else positions + r0
        frame, carry = _kernel(
            records[r0:r1], part, carry, spec=spec, health=health, monitor=monitor, index_base=base
        )
        frames.append(frame)
    return frames[0] if len(frames) == 1 else BarFrame.concat(frames)


def compute_bars(
    records: np.ndarray,
    instrument: InstrumentSpec,
    bars: BarConfig,
    health: HealthConfig,
    monitor: HealthMonitor | None = None,
) -> BarFrame:
    """The closed bars and features of ``instrument`` in ``records`` (vectorised path).

    ``records``: 1-D :data:`MBP10_DTYPE` array in arrival order; it may interleave
    instruments (only ``instrument.instrument_id`` is used). Health episodes and counters go to
    ``monitor`` (a fresh one when ``None``). The records after the last closed bar (the open
    bar) are not used.
    """
    _check_records(records)
    monitor = monitor or HealthMonitor(instrument.instrument_id, instrument.symbol)
    mine = (records["instrument_id"] == instrument.instrument_id) & (records["rtype"] == MBP10_RTYPE)
    if mine.all():
        return _compute(records, 0, spec=instrument, bars=bars, health=health, monitor=monitor)
    positions = np.flatnonzero(mine)
    return _compute(records[positions], positions, spec=instrument, bars=bars, health=health, monitor=monitor)


@dataclasses.dataclass(frozen=True, slots=True)
class FeatureSet:
    """:func:`compute_all`'s result: a frame and a health monitor per configured symbol, and
    the records that were rejected (unknown instrument id, or not an MBP-10 record)."""

    frames: dict[str, BarFrame]
    monitors: dict[str, HealthMonitor]
    rejected_records: int


def compute_all(
    records: np.ndarray,
    instruments: Iterable[InstrumentSpec],
    bars: BarConfig,
    health: HealthConfig,
) -> FeatureSet:
    """:func:`compute_bars` for every configured instrument in ``records`` (interleaved)."""
    _check_records(records)
    specs = list(instruments)
    known = np.array([s.instrument_id for s in specs], dtype=np.uint32)
    ids = records["instrument_id"]
    valid = np.isin(ids, known) & (records["rtype"] == MBP10_RTYPE)
    frames: dict[str, BarFrame] = {}
    monitors: dict[str, HealthMonitor] = {}
    for spec in specs:
        monitor = HealthMonitor(spec.instrument_id, spec.symbol)
        frames[spec.symbol] = compute_bars(records, spec, bars, health, monitor)
        monitors[spec.symbol] = monitor
    return FeatureSet(frames, monitors, int(records.shape[0] - np.count_nonzero(valid)))


_HEAD = struct.Struct("<BBxxI24xQ")  # length (4-byte words), rtype, instrument_id, ts_recv
_RECORD_SIZE = MBP10_DTYPE.itemsize


class IncrementalBars:
    """The incremental path for one instrument: push raw records one at a time, get each bar
    as it closes (the same bars and features as :func:`compute_bars` on the same records).

    ``push`` takes the 368 raw bytes of one MBP-10 record (what a NATS message carries; from an
    array, :meth:`push_records`). Per record it does a few integer operations and appends the
    bytes to the open bar; the kernel runs once per bar. The health state is therefore updated
    at each close (the decision point), except the clock-based checks: :meth:`poll` with the
    caller's clock (simulated in replay) closes due time bars and opens stale episodes, and
    :meth:`report_gap` takes a transport gap.
    """

    def __init__(self, instrument: InstrumentSpec, bars: BarConfig, health: HealthConfig) -> None:
        self.spec = instrument
        self._bars = bars
        self._health = health
        self._stale_ns = _stale_ns(health)
        tick_fixed(instrument.tick_size)
        self._clock = BarClock(bars, self._stale_ns)
        self.monitor = HealthMonitor(instrument.instrument_id, instrument.symbol)
        self._carry = _Carry()
        self._buf = bytearray()
        self._n_open = 0
        self._n_seen = 0
        self._gap = False  # a gap was reported in the open bar
        self._gap_open = False  # the gap episode waits for the next record
        self._stale_open = False  # the clock found the feed stale; the next record ends it

    @property
    def records_seen(self) -> int:
        return self._n_seen

    def book(self) -> BookSnapshot | None:
        """The current book (levels of the last record pushed), ``None`` before any record."""
        if self._n_open:
            raw = bytes(self._buf[-_RECORD_SIZE:])
            return BookSnapshot.from_record(np.frombuffer(raw, MBP10_DTYPE))
        words = self._carry.last_words
        if words is None:
            return None
        return BookSnapshot.from_record(words.view(MBP10_DTYPE))

    def push(self, record: bytes | bytearray | memoryview) -> BarFrame | None:
        """Add one raw MBP-10 record of this instrument; return the bars it closes (or ``None``).

        Raises :class:`FeedError` for bytes that are not one MBP-10 record and
        :class:`UnknownInstrument` for another instrument's record.
        """
        if len(record) != _RECORD_SIZE:
            raise FeedError(f"an MBP-10 record has {_RECORD_SIZE} bytes, got {len(record)}")
        length, rtype, iid, ts = _HEAD.unpack_from(record)
        if rtype != MBP10_RTYPE or length * 4 != _RECORD_SIZE:
            raise FeedError(f"not an MBP-10 record (rtype {rtype:#x}, length {length * 4})")
        if iid != self.spec.instrument_id:
            raise UnknownInstrument(f"record of instrument {iid} pushed to {self.spec.symbol}")
        out = None
        if self._stale_open:
            self._stale_open = False
            self.monitor.silence(self._clock.clock_ts, ts, self._stale_ns)
        closes = self._clock.on_record(ts)
        if closes:
            out = self._close(closes)
        if self._gap_open:
            self._gap_open = False
            self.monitor.gap_ended(ts)
        self._buf += record
        self._n_open += 1
        self._n_seen += 1
        if self._clock.after_record():
            out = self._close([self._clock.clock_ts])
        return out

    def push_records(self, records: np.ndarray) -> list[BarFrame]:
        """:meth:`push` each record of ``records`` (this instrument only, arrival order)."""
        _check_records(records)
        raw = np.ascontiguousarray(records).data.cast("B")
        out = []
        for off in range(0, len(raw), _RECORD_SIZE):
            frame = self.push(raw[off : off + _RECORD_SIZE])
            if frame is not None:
                out.append(frame)
        return out

    def poll(self, now_ns: int) -> BarFrame | None:
        """Judge the feed at the caller's clock ``now_ns`` (UNIX ns): open a stale episode when
        nothing came for ``stale_after_s`` and close the time bars due strictly before now."""
        if self._n_seen and now_ns - self._clock.clock_ts > self._stale_ns:
            self._stale_open = True
            self.monitor.silence(self._clock.clock_ts, None, self._stale_ns)
        closes = self._clock.on_clock(now_ns)
        return self._close(closes) if closes else None

    def report_gap(self, at_ns: int) -> None:
        """The transport lost records at ``at_ns``: the open bar is not tradable and a gap
        episode runs until the next record."""
        self._gap = self._gap_open = True
        self.monitor.gap(at_ns)

    def _close(self, closes: list[int]) -> BarFrame:
        n = self._n_open
        records = np.frombuffer(bytes(self._buf), MBP10_DTYPE) if n else np.zeros(0, MBP10_DTYPE)
        plan = BarPlan(
            ends=np.full(len(closes), n, np.int64),
            close_ts=np.array(closes, np.int64),
        )
        frame, self._carry = _kernel(
            records,
            plan,
            self._carry,
            spec=self.spec,
            health=self._health,
            monitor=self.monitor,
            index_base=self._n_seen - n,
            blocked_first=self._gap,
        )
        self._gap = False
        self._buf.clear()
        self._n_open = 0
        return frame


class IncrementalFeatures:
    """:class:`IncrementalBars` for several instruments: routes raw records by instrument id.

    Records of an instrument that is not configured, or bytes that are not an MBP-10 record,
    are counted in :attr:`rejected` and dropped (never raised, never passed on).
    """

    def __init__(self, instruments: Iterable[InstrumentSpec], bars: BarConfig, health: HealthConfig) -> None:
        self.by_id: dict[int, IncrementalBars] = {
            spec.instrument_id: IncrementalBars(spec, bars, health) for spec in instruments
        }
        self.rejected = 0

    def push(self, record: bytes | bytearray | memoryview) -> BarFrame | None:
        """Route one raw record; return the bars it closes for its instrument (or ``None``)."""
        if len(record) != _RECORD_SIZE:
            self.rejected += 1
            return None
        builder = self.by_id.get(_HEAD.unpack_from(record)[2])
        if builder is None:
            self.rejected += 1
            return None
        try:
            return builder.push(record)
        except FeedError:
            self.rejected += 1
            return None

    def push_records(self, records: np.ndarray) -> list[BarFrame]:
        """Route every record of ``records`` (any instruments, arrival order)."""
        _check_records(records)
        raw = np.ascontiguousarray(records).data.cast("B")
        out = []
        for off in range(0, len(raw), _RECORD_SIZE):
            frame = self.push(raw[off : off + _RECORD_SIZE])
            if frame is not None:
                out.append(frame)
        return out

    def poll(self, now_ns: int) -> list[BarFrame]:
        """:meth:`IncrementalBars.poll` for every instrument; the frames that closed."""
        out = []
        for builder in self.by_id.values():
            frame = builder.poll(now_ns)
            if frame is not None:
                out.append(frame)
        return out
