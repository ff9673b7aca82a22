"""Causal bar features per instrument: one set of definitions, a vectorised and an incremental path.

Both paths reduce a bar's records to the same *sufficient statistics*, all integers (per-level
order-flow imbalance, signed and total traded volume, trade count, records, unhealthy records,
the sum of squared mid steps in half-ticks) plus the book at the close, and turn them into
features with one function, :func:`_finalise` (and :func:`_book_values`). The record rules are
shared the same way: :func:`feeds.health.fault_mask` and :func:`ofi_price_term` are written once
over operands that are Python ints (one record) or int64 arrays (many).

* :func:`compute_bars` (replay, training) evaluates them over arrays, a group of whole bars of
  about :data:`_CHUNK_RECORDS` records at a time (a small carry links the groups);
* :class:`IncrementalBars` (live) unpacks each raw record once and updates the open bar's
  statistics in plain Python; at the close it calls :func:`_finalise` on scalars.

Integers are exact and NumPy's ``log``/``sin``/``cos`` give the same bits on scalars and arrays,
so the features are identical on both paths (tests/feeds/test_features_parity.py checks every
column bit for bit, on random, faulty, synthetic and official data).

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
from typing import Any

import numpy as np

from feeds.bars import BarClock, BarPlan, plan_bars
from feeds.book import BookSnapshot, level_arrays, tick_fixed
from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.errors import FeedError, UnknownInstrument
from feeds.health import (
    RECORD_FAULTS,
    HealthMonitor,
    PrevTop,
    fault_mask,
    prev_top_of,
    record_faults,
    valid_top,
)
from feeds.records import (
    ACTION_TRADE,
    LEVELS,
    MBP10_DTYPE,
    MBP10_RTYPE,
    PRICE_SCALE,
    SIDE_ASK,
    SIDE_BID,
    UNDEF_PRICE,
)

__all__ = [
    "BOOK_INTS",
    "FEATURE_NAMES",
    "BarFrame",
    "FeatureSet",
    "IncrementalBars",
    "IncrementalFeatures",
    "compute_all",
    "compute_bars",
    "ofi_price_term",
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
    "realized_var_ticks2",  # sum of squared record-to-record mid changes in the bar, ticks^2
    "update_count",  # records in the bar
    "log_depth_bid_l10",  # log1p(contracts on the 10 bid levels), book at close
    "log_depth_ask_l10",
    "bar_seconds",  # time since the previous close, s (0 for the first bar)
    "tod_sin",  # time of day of the close (UTC), sin(2 pi s / 86400)
    "tod_cos",
)
_F = len(FEATURE_NAMES)
_COL = {name: i for i, name in enumerate(FEATURE_NAMES)}
_OFI_COL = _COL["ofi_l1"]
_SCALAR_NAMES = [name for name in FEATURE_NAMES if not name.startswith("ofi_")]
"""The features :func:`_finalise` computes, in :data:`FEATURE_NAMES` order; the OFI columns
(``ofi_l1..ofi_l10``, ``ofi_total``) sit together at ``_OFI_COL``."""
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
    """State the vectorised kernel hands from one group of bars to the next (all from records
    before the group): what :class:`IncrementalBars` keeps in its own fields."""

    prev: PrevTop | None = None  # health rules
    last_words: np.ndarray | None = None  # the last record as int64 words, (_WORDS,)
    last_ok: bool = False  # last record healthy
    last_clock: int = 0  # clock (max ts_recv) of the last record, 0 = none
    last_index: int = -1
    book: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(BOOK_INTS), np.int64))
    has_book: bool = False
    mid2: int = 0  # bid + ask (fixed point) of the last healthy record, 0 = none
    half_ticks: int = 0  # the same in ticks (twice the mid in ticks), 0 = none
    close_mid2: int = 0  # mid2 at the previous close
    close_ts: int = 0  # previous close, 0 = none


def _bar_sums(x: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per-bar sums of ``x`` (``(n,)`` or ``(n, k)``) over ``[starts[j], ends[j])``; 0 for
    empty bars. Bars are contiguous, so the non-empty ones tile ``x[:ends[-1]]``."""
    out = np.zeros((starts.shape[0], *x.shape[1:]), dtype=x.dtype)
    nonempty = ends > starts
    if nonempty.any():
        out[nonempty] = np.add.reduceat(x, starts[nonempty], axis=0)
    return out


_WORDS = MBP10_DTYPE.itemsize // 8  # a record as int64 words
_LEVEL_WORD = MBP10_DTYPE.fields["bid_px_00"][1] // 8  # type: ignore[index]
_BID_PX = _LEVEL_WORD + 4 * np.arange(LEVELS)  # word of level k's bid price
_ASK_PX = _BID_PX + 1
_SIZES = _BID_PX + 2  # bid size in the low 32 bits, ask size in the high 32 bits
_LOW32 = np.int64(0xFFFFFFFF)
_DEPTH_COLS = [k - 1 for k in (1, 3, 5, 10)]


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
            val = ofi_price_term(p1, p0, s1 & _LOW32, s0 & _LOW32, bid=True)
        else:
            val = ofi_price_term(p1, p0, s1 >> 32, s0 >> 32, bid=False)
        bars.append(np.searchsorted(ends, rows, side="right"))
        levels.append(lev)
        values.append(val)
    bad = np.flatnonzero(~pair_ok)
    if bad.shape[0]:
        now = words[bad][:, _SIZES]
        before = words[np.maximum(bad - 1, 0)][:, _SIZES]
        if carried is not None:
            before[bad == 0] = carried[_SIZES]
        change = ((now & _LOW32) - (before & _LOW32)) - ((now >> 32) - (before >> 32))
        bars.append(np.repeat(np.searchsorted(ends, bad, side="right"), LEVELS))
        levels.append(np.tile(np.arange(LEVELS), bad.shape[0]))
        values.append(-change.ravel())
    flat = np.concatenate(bars) * LEVELS + np.concatenate(levels)
    if flat.shape[0] and n:
        sums = np.bincount(flat, weights=np.concatenate(values), minlength=n_bars * LEVELS)
        ofi += sums.astype(np.int64).reshape(n_bars, LEVELS)
    return ofi


def ofi_price_term(p1: Any, p0: Any, q1: Any, q0: Any, *, bid: bool) -> Any:
    """The part of one level's order-flow term that a price change adds to the size change.

    With ``p0, q0`` a level's price and size before a record and ``p1, q1`` after it, the
    level's OFI term (:func:`_bar_ofi`) is ``(q1 - q0) + ofi_price_term(...)`` on the bid side
    and ``-(q1 - q0) + ofi_price_term(...)`` on the ask side. Operands are Python ints or int64
    arrays (both paths use this one definition). An empty bid level (``UNDEF_PRICE``) is the
    lowest price; an empty ask level is the highest, as ``UNDEF_PRICE`` already is.
    """
    if bid:
        up = (p1 != p0) & ((p0 == UNDEF_PRICE) | ((p1 != UNDEF_PRICE) & (p1 > p0)))
        down = (p1 != p0) & (up ^ True)
        return up * q0 - down * q1
    return (p1 > p0) * q1 - (p1 < p0) * q0


class _ScalarOps:
    """Operations of :func:`_book_values` and :func:`_finalise` on Python scalars (one bar).

    NumPy's ``log``/``sin``/``cos``/``log1p`` are used on both paths: on scalars they run the
    same inner loops as on arrays, so both paths agree bit for bit (``math.log`` may not: NumPy
    has its own SIMD logarithm)."""

    log = staticmethod(np.log)
    log1p = staticmethod(np.log1p)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b


class _ArrayOps:
    """The same operations on arrays (many bars)."""

    log = staticmethod(np.log)
    log1p = staticmethod(np.log1p)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    where = staticmethod(np.where)


_Ops = Any  # type[_ScalarOps] | type[_ArrayOps]: duck-typed, since operands are ints or arrays

BOOK_INTS: tuple[str, ...] = (
    "bid",
    "ask",
    "bid_size",
    "ask_size",
    *(f"bid_depth_l{k}" for k in (1, 3, 5, 10)),
    *(f"ask_depth_l{k}" for k in (1, 3, 5, 10)),
)
"""What a bar keeps of the book at its close: best prices (fixed point), best sizes and the
sizes summed over levels 1..k (contracts); all zero before the first healthy record."""
_DEPTH_LEVELS = (1, 3, 5, 10)


def _book_values(book: Any, tick: int, ops: _Ops) -> dict[str, Any]:
    """Book features at a close from :data:`BOOK_INTS` values (ints, or int64 arrays).

    ``spread_ticks = (a - b) / tick``; ``microprice_offset_ticks`` = (microprice - mid) / tick =
    ``spread_ticks * (qb - qa) / (2 (qb + qa))`` (microprice ``(b qa + a qb) / (qa + qb)``);
    ``depth_imbalance_lk = (B_k - A_k) / (B_k + A_k)``; ``log_depth_*_l10 = log1p(size on 10
    levels)``; every ratio is 0 when its denominator is 0 (no book yet)."""
    bid, ask, qb, qa = book[0], book[1], book[2], book[3]
    top = qb + qa
    spread = (ask - bid) / tick
    out = {
        "mid_ticks": (bid + ask) / (2 * tick),
        "spread_ticks": spread,
        "microprice_offset_ticks": spread * (qb - qa) / (2 * ops.where(top > 0, top, 1)),
        "bid_price": bid / PRICE_SCALE,
        "ask_price": ask / PRICE_SCALE,
        "mid_price": (bid + ask) / (2 * PRICE_SCALE),
        "log_depth_bid_l10": ops.log1p(book[7] * 1.0),  # float in: NumPy's scalar path is 6x faster
        "log_depth_ask_l10": ops.log1p(book[11] * 1.0),
    }
    for i, k in enumerate(_DEPTH_LEVELS):
        b_k, a_k = book[4 + i], book[8 + i]
        total = b_k + a_k
        out[f"depth_imbalance_l{k}"] = (b_k - a_k) / ops.where(total > 0, total, 1)
    return out


def _finalise(
    *,
    mid2: Any,
    mid2_before: Any,
    close_ts: Any,
    close_ts_before: Any,
    book_values: dict[str, Any],
    signed_volume: Any,
    volume: Any,
    trades: Any,
    records: Any,
    rv_half_ticks2: Any,
    tick: int,
    ops: _Ops,
) -> dict[str, Any]:
    """Every feature but the per-level OFI from a bar's sufficient statistics, for one bar
    (Python scalars) or many (arrays): the one definition both paths use.

    ``mid2``/``mid2_before``: best bid + best ask (fixed point) of the last healthy record at
    this close and at the previous one (0: none yet); ``book_values``: :func:`_book_values` of the
    book at the close; ``rv_half_ticks2``: sum over the bar of the squared record-to-record
    change of ``mid2`` in ticks (twice the mid in ticks)."""
    ok = (mid2 > 0) & (mid2_before > 0)
    angle = (close_ts % _DAY_NS) * (_TWO_PI / _DAY_NS)
    return book_values | {
        "mid_logret": ops.log(ops.where(ok, mid2, 1) / ops.where(ok, mid2_before, 1)),
        "mid_change_ticks": ops.where(ok, mid2 - mid2_before, 0) / (2 * tick),
        "trade_volume_signed": signed_volume,
        "trade_volume": volume,
        "trade_count": trades,
        "realized_var_ticks2": rv_half_ticks2 / 4,
        "update_count": records,
        "bar_seconds": (close_ts - close_ts_before) / 1e9,
        "tod_sin": ops.sin(angle),
        "tod_cos": ops.cos(angle),
    }


def _kernel(
    records: np.ndarray,
    plan: BarPlan,
    carry: _Carry,
    *,
    spec: InstrumentSpec,
    health: HealthConfig,
    monitor: HealthMonitor,
    index_base: np.ndarray | int,
) -> tuple[BarFrame, _Carry]:
    """The vectorised path: features of the bars of ``plan`` over ``records`` (one instrument,
    exactly the records of those bars, in arrival order, contiguous). ``index_base`` maps local
    record indices to ``close_index`` (an int offset or an int64 ``(n,)`` position array).
    Returns the frame and the carry for the next group of bars."""
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

        # twice the mid (bid + ask) of the last healthy record, record by record
        mid2 = bid + ask
        last_ok_idx = np.maximum.accumulate(np.where(ok, np.arange(n), -1))
        has_h = last_ok_idx >= 0
        half_ticks = np.where(has_h, mid2[np.maximum(last_ok_idx, 0)] // tick, carry.half_ticks)
        before = np.empty(n, np.int64)
        before[0] = carry.half_ticks
        before[1:] = half_ticks[:-1]
        step = np.where((half_ticks > 0) & (before > 0), half_ticks - before, 0)
        rv = _bar_sums(step * step, starts, ends)
    else:
        ofi = np.zeros((n_bars, LEVELS), np.int64)
        flows = np.zeros((n_bars, 4), np.int64)
        rv = np.zeros(n_bars, np.int64)

    # the book at each close: last healthy record at or before it, else carried
    last = ends - 1
    has_rec = last >= 0
    book = np.empty((n_bars, len(BOOK_INTS)), np.int64)
    book[:] = carry.book
    close_mid2 = np.full(n_bars, carry.mid2, np.int64)
    has_book = np.full(n_bars, carry.has_book)
    last_ok_bar = np.full(n_bars, carry.last_ok)
    last_clock = np.full(n_bars, carry.last_clock, np.int64)
    if n:
        h = np.where(has_rec, last_ok_idx[np.maximum(last, 0)], -1)
        with_book = h >= 0
        rows = h[with_book]
        sizes = words[rows][:, _SIZES]
        depth_b = np.cumsum(sizes & _LOW32, axis=1)[:, _DEPTH_COLS]
        depth_a = np.cumsum(sizes >> 32, axis=1)[:, _DEPTH_COLS]
        book[with_book] = np.concatenate(
            (np.stack((bid[rows], ask[rows], depth_b[:, 0], depth_a[:, 0]), axis=1), depth_b, depth_a), axis=1
        )
        close_mid2[with_book] = mid2[rows]
        has_book |= with_book
        last_ok_bar[has_rec] = ok[last[has_rec]]
        last_clock[has_rec] = clock[last[has_rec]]
    close_mid2_before = np.empty(n_bars, np.int64)
    if n_bars:
        close_mid2_before[0] = carry.close_mid2
        close_mid2_before[1:] = close_mid2[:-1]

    close_ts = plan.close_ts.astype(np.int64)
    prev_close_ts = np.empty(n_bars, np.int64)
    if n_bars:
        prev_close_ts[0] = carry.close_ts or close_ts[0]
        prev_close_ts[1:] = close_ts[:-1]

    n_records = ends - starts
    values = _finalise(
        mid2=close_mid2,
        mid2_before=close_mid2_before,
        close_ts=close_ts,
        close_ts_before=prev_close_ts,
        book_values=_book_values(book.T, tick, _ArrayOps),
        signed_volume=flows[:, 0],
        volume=flows[:, 1],
        trades=flows[:, 2],
        records=n_records,
        rv_half_ticks2=rv,
        tick=tick,
        ops=_ArrayOps,
    )
    feats = np.empty((n_bars, _F), np.float64)
    for name, col in _COL.items():
        if name in values:
            feats[:, col] = values[name]
    ofi_col = _COL["ofi_l1"]
    feats[:, ofi_col : ofi_col + LEVELS] = ofi
    feats[:, _COL["ofi_total"]] = ofi.sum(axis=1)

    tradable = (flows[:, 3] == 0) & last_ok_bar & has_book & (close_ts - last_clock <= stale_ns)
    tradable &= last_clock > 0

    if isinstance(index_base, np.ndarray):
        close_index = np.where(has_rec, index_base[np.maximum(last, 0)], carry.last_index)
    else:
        close_index = np.where(has_rec, last + index_base, carry.last_index)

    frame = BarFrame(
        instrument_id=spec.instrument_id,
        symbol=spec.symbol,
        ts_close=close_ts,
        features=feats.astype(np.float32),
        mid_ticks=np.asarray(values["mid_ticks"], np.float64),
        mid_price=np.asarray(values["mid_price"], np.float64),
        spread_ticks=np.asarray(values["spread_ticks"], np.float64),
        bid_price=np.asarray(values["bid_price"], np.float64),
        ask_price=np.asarray(values["ask_price"], np.float64),
        bid_size=book[:, 2].copy(),
        ask_size=book[:, 3].copy(),
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
        mid2=int(close_mid2[-1]),
        half_ticks=int(half_ticks[-1]) if n else carry.half_ticks,
        close_mid2=int(close_mid2[-1]),
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
    source: np.ndarray,
    positions: np.ndarray | None,
    *,
    spec: InstrumentSpec,
    bars: BarConfig,
    health: HealthConfig,
    monitor: HealthMonitor,
) -> BarFrame:
    """The vectorised path over the instrument's records: ``source`` itself (contiguous) when
    ``positions`` is ``None``, else ``source[positions]``, gathered one group of bars at a time
    (a small copy that stays in cache instead of one copy of every record)."""
    stale_ns = _stale_ns(health)
    ts = source["ts_recv"] if positions is None else source["ts_recv"][positions]
    clock = np.maximum.accumulate(ts.astype(np.int64)) if len(ts) else np.zeros(0, np.int64)
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
        base: np.ndarray | int
        if positions is None:
            records, base = source[r0:r1], r0
        else:
            base = positions[r0:r1]
            records = source[base]
        frame, carry = _kernel(
            records, part, carry, spec=spec, health=health, monitor=monitor, index_base=base
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
        records = np.ascontiguousarray(records)  # the kernel views records as int64 words
        return _compute(records, None, spec=instrument, bars=bars, health=health, monitor=monitor)
    positions = np.flatnonzero(mine)
    return _compute(records, positions, spec=instrument, bars=bars, health=health, monitor=monitor)


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


_REC = struct.Struct("<BBHIQqIccBBQiI" + "qqIIII" * LEVELS)
"""One MBP-10 record as Python values: header and event fields (0-13), then level ``k`` at
``14 + 6k``: bid_px, ask_px, bid_sz, ask_sz, bid_ct, ask_ct."""
_RECORD_SIZE = MBP10_DTYPE.itemsize
_IID = struct.Struct("<4xI")
# positions in an unpacked record
_F_LENGTH, _F_RTYPE, _F_IID, _F_PRICE, _F_SIZE = 0, 1, 3, 5, 6
_F_ACTION, _F_SIDE, _F_TS, _F_SEQ = 7, 8, 11, 13


def _book_ints(f: tuple[Any, ...]) -> tuple[int, ...]:
    """:data:`BOOK_INTS` of an unpacked record."""
    bs, as_ = f[16::6], f[17::6]
    b3 = bs[0] + bs[1] + bs[2]
    a3 = as_[0] + as_[1] + as_[2]
    b5, a5 = b3 + bs[3] + bs[4], a3 + as_[3] + as_[4]
    return (f[14], f[15], bs[0], as_[0], bs[0], b3, b5, b5 + sum(bs[5:]), as_[0], a3, a5, a5 + sum(as_[5:]))


class IncrementalBars:
    """The incremental path for one instrument: push raw records one at a time, get each bar
    as it closes (the same bars and features as :func:`compute_bars` on the same records).

    ``push`` takes the 368 raw bytes of one MBP-10 record (what a NATS message carries; from an
    array, :meth:`push_records`). Per record it unpacks the fields once and updates the bar's
    sufficient statistics in plain Python with the shared definitions (:func:`fault_mask`,
    :func:`ofi_price_term`); at the close :func:`_finalise` turns them into features, the same
    function the vectorised path applies to arrays. :meth:`poll` with the caller's clock
    (simulated in replay) closes due time bars and opens stale episodes; :meth:`report_gap`
    takes a transport gap (the open bar is not tradable). Record-check episodes reach
    :attr:`monitor` when the bar closes (the decision point), stale and gap episodes at once.
    """

    def __init__(self, instrument: InstrumentSpec, bars: BarConfig, health: HealthConfig) -> None:
        self.spec = instrument
        self._health = health
        self._stale_ns = _stale_ns(health)
        self._tick = tick_fixed(instrument.tick_size)
        self._clock = BarClock(bars, self._stale_ns)
        self.monitor = HealthMonitor(instrument.instrument_id, instrument.symbol)
        self._n_seen = 0
        self._gap = False  # a gap was reported in the open bar
        self._gap_open = False  # the gap episode waits for the next record
        self._stale_open = False  # the clock found the feed stale; the next record ends it
        # the previous record
        self._last: tuple[Any, ...] | None = None
        self._last_ok = False
        self._last_bid = self._last_ask = UNDEF_PRICE  # valid best prices, for the jump rule
        # the last healthy record and the previous close
        self._healthy: tuple[Any, ...] | None = None
        self._book: tuple[int, ...] = (0,) * len(BOOK_INTS)
        self._book_values = _book_values(self._book, self._tick, _ScalarOps)
        self._book_of: tuple[Any, ...] | None = None
        self._mid2 = 0
        self._half_ticks = 0
        self._close_mid2 = 0
        self._close_ts = 0
        self._close_index = -1
        self._end_sizes: tuple[Any, ...] | None = None  # sizes at the previous bar's last record
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
        """The current book (levels of the last record pushed), ``None`` before any record."""
        f = self._last
        if f is None:
            return None
        return BookSnapshot(
            instrument_id=self.spec.instrument_id,
            ts_recv=f[_F_TS],
            bid_px=f[14::6],
            ask_px=f[15::6],
            bid_sz=f[16::6],
            ask_sz=f[17::6],
        )

    def push(self, record: bytes | bytearray | memoryview) -> BarFrame | None:
        """Add one raw MBP-10 record of this instrument; return the bars it closes (or ``None``).

        Raises :class:`FeedError` for bytes that are not one MBP-10 record and
        :class:`UnknownInstrument` for another instrument's record.
        """
        if len(record) != _RECORD_SIZE:
            raise FeedError(f"an MBP-10 record has {_RECORD_SIZE} bytes, got {len(record)}")
        f = _REC.unpack_from(record)
        if f[_F_RTYPE] != MBP10_RTYPE or f[_F_LENGTH] * 4 != _RECORD_SIZE:
            raise FeedError(f"not an MBP-10 record (rtype {f[_F_RTYPE]:#x}, length {f[_F_LENGTH] * 4})")
        if f[_F_IID] != self.spec.instrument_id:
            raise UnknownInstrument(f"record of instrument {f[_F_IID]} pushed to {self.spec.symbol}")
        ts = f[_F_TS]
        last = self._last
        clock_before = self._clock.clock_ts if last is not None else ts
        if self._stale_open or (last is not None and ts - clock_before > self._stale_ns):
            self._stale_open = False
            self.monitor.silence(clock_before, ts, self._stale_ns)
        if self._gap_open:
            self._gap_open = False
            self.monitor.gap_ended(ts)
        closes = self._clock.on_record(ts)
        out = self._close(closes, clock_before) if closes else None

        bids, asks, bsz, asz = f[14::6], f[15::6], f[16::6], f[17::6]
        bid, ask = bids[0], asks[0]
        is_trade = f[_F_ACTION] == ACTION_TRADE
        mask = fault_mask(
            bid=bid,
            ask=ask,
            bid_sz=bsz[0],
            ask_sz=asz[0],
            trade_price=f[_F_PRICE] if is_trade else 1,
            ts=ts,
            clock_before=clock_before,
            seq=f[_F_SEQ],
            seq_before=f[_F_SEQ] if last is None else last[_F_SEQ],
            bid_before=self._last_bid,
            ask_before=self._last_ask,
            tick=self._tick,
            config=self._health,
        )
        ok = mask == 0
        self._ts.append(ts)
        self._masks.append(mask)
        if last is not None:
            ofi = self._ofi
            if ok and self._last_ok:
                if bids != last[14::6]:
                    pb, pq = last[14::6], last[16::6]
                    for k in range(LEVELS):
                        if bids[k] != pb[k]:
                            ofi[k] += ofi_price_term(bids[k], pb[k], bsz[k], pq[k], bid=True)
                if asks != last[15::6]:
                    pa, pq = last[15::6], last[17::6]
                    for k in range(LEVELS):
                        if asks[k] != pa[k]:
                            ofi[k] += ofi_price_term(asks[k], pa[k], asz[k], pq[k], bid=False)
            else:  # a pair with an unhealthy record adds no flow
                pqb, pqa = last[16::6], last[17::6]
                for k in range(LEVELS):
                    ofi[k] -= (bsz[k] - pqb[k]) - (asz[k] - pqa[k])
        else:
            self._end_sizes = f
        if is_trade:
            size = f[_F_SIZE]
            self._trades += 1
            self._volume += size
            side = f[_F_SIDE]
            if side == SIDE_BID:
                self._signed += size
            elif side == SIDE_ASK:
                self._signed -= size
        if ok:
            mid2 = bid + ask
            half_ticks = mid2 // self._tick
            if half_ticks > 0 and self._half_ticks > 0:
                step = half_ticks - self._half_ticks
                self._rv += step * step
            self._half_ticks = half_ticks
            self._mid2 = mid2
            self._healthy = f
        else:
            self._n_bad += 1
        self._last = f
        self._last_ok = ok
        self._last_bid = valid_top(bid)
        self._last_ask = valid_top(ask)
        self._n_open += 1
        self._n_seen += 1
        if self._clock.after_record():
            out = self._close([self._clock.clock_ts], self._clock.clock_ts)
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
        clock = self._clock.clock_ts
        if self._last is not None and now_ns - clock > self._stale_ns:
            self._stale_open = True
            self.monitor.silence(clock, None, self._stale_ns)
        closes = self._clock.on_clock(now_ns)
        return self._close(closes, clock) if closes else None

    def report_gap(self, at_ns: int) -> None:
        """The transport lost records at ``at_ns``: the open bar is not tradable and a gap
        episode runs until the next record."""
        self._gap = self._gap_open = True
        self.monitor.gap(at_ns)

    def _close(self, closes: list[int], last_clock: int) -> BarFrame:
        """The bars closing at ``closes``: the open bar (when it holds records) and empty bars.
        ``last_clock`` is the clock of the last record before the close."""
        if self._masks and (any(self._masks) or self.monitor.failing_records()):
            self.monitor.observe(np.array(self._ts, np.int64), np.array(self._masks, np.uint8))
        rows: list[list[float]] = []
        prices: list[tuple[float, ...]] = []
        ints: list[tuple[int, ...]] = []
        tradables: list[bool] = []
        tick = self._tick
        for j, close in enumerate(closes):
            n = self._n_open if j == 0 else 0
            if n:
                last, start = self._last, self._end_sizes
                assert last is not None and start is not None
                lb, la, sb, sa = last[16::6], last[17::6], start[16::6], start[17::6]
                ofi = [(lb[k] - sb[k]) - (la[k] - sa[k]) + self._ofi[k] for k in range(LEVELS)]
                self._end_sizes = last
                self._close_index = self._n_seen - 1
                stats = (self._signed, self._volume, self._trades, self._rv)
                if self._healthy is not self._book_of and self._healthy is not None:
                    self._book_of = self._healthy
                    book = _book_ints(self._healthy)
                    if book != self._book:
                        self._book = book
                        self._book_values = _book_values(book, tick, _ScalarOps)
            else:
                ofi = [0] * LEVELS
                stats = (0, 0, 0, 0)
            values = _finalise(
                mid2=self._mid2,
                mid2_before=self._close_mid2,
                close_ts=close,
                close_ts_before=self._close_ts or close,
                book_values=self._book_values,
                signed_volume=stats[0],
                volume=stats[1],
                trades=stats[2],
                records=n,
                rv_half_ticks2=stats[3],
                tick=tick,
                ops=_ScalarOps,
            )
            row = [values[name] for name in _SCALAR_NAMES]
            row[_OFI_COL:_OFI_COL] = [*ofi, sum(ofi)]
            rows.append(row)
            tradable = (
                (self._n_bad == 0 or n == 0)
                and self._last_ok
                and self._healthy is not None
                and close - last_clock <= self._stale_ns
                and last_clock > 0
                and not (j == 0 and self._gap)
            )
            tradables.append(tradable)
            prices.append(
                (
                    values["mid_ticks"],
                    values["mid_price"],
                    values["spread_ticks"],
                    values["bid_price"],
                    values["ask_price"],
                )
            )
            ints.append((close, self._book[2], self._book[3], self._close_index, n))
            self._close_mid2 = self._mid2
            self._close_ts = close
            if j == 0:
                self._gap = False
                self._open_bar()
        f8 = np.array(prices, np.float64).T  # one allocation per kind; the columns are its rows
        i8 = np.array(ints, np.int64).T
        return BarFrame(
            instrument_id=self.spec.instrument_id,
            symbol=self.spec.symbol,
            ts_close=i8[0],
            features=np.array(rows, np.float64).astype(np.float32),
            mid_ticks=f8[0],
            mid_price=f8[1],
            spread_ticks=f8[2],
            bid_price=f8[3],
            ask_price=f8[4],
            bid_size=i8[1],
            ask_size=i8[2],
            close_index=i8[3],
            n_records=i8[4],
            tradable=np.array(tradables, bool),
        )


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
        builder = self.by_id.get(_IID.unpack_from(record)[0])
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
        contiguous = np.ascontiguousarray(records)
        raw = contiguous.data.cast("B")
        route = self.by_id.get
        out = []
        for i, iid in enumerate(contiguous["instrument_id"].tolist()):
            builder = route(iid)
            if builder is None:
                self.rejected += 1
                continue
            off = i * _RECORD_SIZE
            try:
                frame = builder.push(raw[off : off + _RECORD_SIZE])
            except FeedError:
                self.rejected += 1
                continue
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
