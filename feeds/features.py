"""Causal bar features per instrument: one set of definitions, a vectorised and an incremental path.

Both paths reduce a bar's records to the same *sufficient statistics*, all integers (per-level
order-flow imbalance, signed and total traded volume, trade count, records, unhealthy records,
the sum of squared mid steps in half-ticks) plus the book at the close, and turn them into
features with one function over arrays of closed bars, :func:`_bar_frames`. The record rules are
shared the same way: :func:`feeds.health.fault_mask` and :func:`ofi_price_term` are written once
over operands that are Python ints (one record) or int64 arrays (many).

* :func:`compute_bars` / :func:`compute_all` (replay, training) evaluate them over arrays, a
  group of whole bars of about :data:`_GROUP_RECORDS` records at a time (a small carry links
  the groups); :class:`FeatureStream` and :func:`compute_file` do the same over records that
  arrive in chunks (a file read in bounded memory), holding the open bar's records back;
* :class:`IncrementalBars` (live) unpacks each raw record once and updates the open bar's
  statistics in plain Python; the bars that one call closes go through :func:`_bar_frames`
  together.

Integers are exact and the features come from the same array code on both paths, so they are
identical bit for bit (tests/feeds/test_features_parity.py checks every column, on random,
faulty, synthetic and official data).

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

import collections
import dataclasses
import itertools
import math
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feeds.bars import BarClock, BarPlan, plan_bars
from feeds.book import BookSnapshot, tick_fixed
from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.dbn.framing import mbp10_header_ok, take_mbp10
from feeds.dbn.reader import iter_mbp10
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
    MBP10_CODES,
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
    "FILE_CHUNK_RECORDS",
    "BarFrame",
    "FeatureSet",
    "FeatureStream",
    "IncrementalBars",
    "IncrementalFeatures",
    "compute_all",
    "compute_bars",
    "compute_file",
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
_OFI_COL = FEATURE_NAMES.index("ofi_l1")
_SCALAR_NAMES = [name for name in FEATURE_NAMES if not name.startswith("ofi_")]
"""The features other than order-flow imbalance, in :data:`FEATURE_NAMES` order; the OFI columns
(``ofi_l1..ofi_l10``, then ``ofi_total``) sit together at ``_OFI_COL``."""
assert FEATURE_NAMES[_OFI_COL : _OFI_COL + LEVELS + 1] == (*(f"ofi_l{m}" for m in range(1, 11)), "ofi_total")
assert len(_SCALAR_NAMES) + LEVELS + 1 == _F
_ROW = {name: i for i, name in enumerate(_SCALAR_NAMES)}
assert [_ROW[f"depth_imbalance_l{k}"] for k in (1, 3, 5, 10)] == list(
    range(_ROW["depth_imbalance_l1"], _ROW["depth_imbalance_l1"] + 4)
)
assert _ROW["log_depth_ask_l10"] == _ROW["log_depth_bid_l10"] + 1
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
_TRADE, _BID, _ASK = ord(ACTION_TRADE), ord(SIDE_BID), ord(SIDE_ASK)


def _size_words(words: np.ndarray) -> np.ndarray:
    """The size words of the levels of records as int64 words, a strided ``(n, LEVELS)`` view
    (indexing its rows is ~3x faster than indexing words by row and column)."""
    return words[:, _SIZES[0] : _SIZES[-1] + 1 : 4]


def _side_sizes(size_words: np.ndarray, bid: bool) -> np.ndarray:
    """The bid (low 32 bits) or ask (high 32 bits) sizes of level size words."""
    return size_words & _LOW32 if bid else size_words >> 32


def _bar_ofi(
    words: np.ndarray, carried: np.ndarray | None, pair_ok: np.ndarray, ends: np.ndarray, bar_of: np.ndarray
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
    contributes nothing. ``bar_of`` is the bar of each record.

    Computed without a dense pass over sizes: where prices are unchanged ``e`` is the size
    change, which telescopes over a bar to (size at the bar's last record - size at the previous
    bar's last record); the records where a level's price changed (sparse) and the excluded
    pairs are corrected exactly. All in integers: the result does not depend on how records are
    grouped into calls.
    """
    n_bars = ends.shape[0]
    first = carried if carried is not None else words[0]
    last = ends - 1
    size_end = _size_words(words)[np.maximum(last, 0)]
    size_end[last < 0] = first[_SIZES]
    net_end = (size_end & _LOW32) - (size_end >> 32)  # bid minus ask size per level
    net_first = (first[_SIZES] & _LOW32) - (first[_SIZES] >> 32)
    ofi: np.ndarray = np.empty_like(net_end)
    ofi[0] = net_end[0] - net_first
    np.subtract(net_end[1:], net_end[:-1], out=ofi[1:])

    flat = words.reshape(-1)  # word c of record i is flat[i * _WORDS + c]
    cells: list[np.ndarray] = []  # bar * LEVELS + level of each correction
    values: list[np.ndarray] = []
    for cols, bid in ((_BID_PX, True), (_ASK_PX, False)):
        px = words[:, cols[0] : cols[-1] + 1 : 4]  # (n, LEVELS) strided view
        changed = np.flatnonzero(px[1:] != px[:-1])
        rows = changed // LEVELS + 1
        keep = pair_ok[rows]
        rows, lev = rows[keep], (changed % LEVELS)[keep]
        at = rows * _WORDS + cols[lev]  # the level's price word
        size_at = at + (_SIZES[0] - cols[0])  # and its size word
        p1, p0 = flat[at], flat[at - _WORDS]
        q1, q0 = _side_sizes(flat[size_at], bid), _side_sizes(flat[size_at - _WORDS], bid)
        cells.append(bar_of[rows] * LEVELS + lev)
        values.append(ofi_price_term(p1, p0, q1, q0, bid=bid))
        if carried is not None and pair_ok[0]:  # the first record against the carried one
            lev0 = np.flatnonzero(px[0] != carried[cols])
            q1, q0 = _side_sizes(words[0, _SIZES[lev0]], bid), _side_sizes(carried[_SIZES[lev0]], bid)
            cells.append(bar_of[0] * LEVELS + lev0)
            values.append(ofi_price_term(px[0, lev0], carried[cols[lev0]], q1, q0, bid=bid))
    bad = np.flatnonzero(~pair_ok)
    if bad.shape[0]:
        now = _size_words(words)[bad]
        before = _size_words(words)[np.maximum(bad - 1, 0)]
        if carried is not None:
            before[bad == 0] = carried[_SIZES]
        change = ((now & _LOW32) - (before & _LOW32)) - ((now >> 32) - (before >> 32))
        cells.append(((bar_of[bad] * LEVELS)[:, None] + np.arange(LEVELS)).ravel())
        values.append(-change.ravel())
    cell = np.concatenate(cells)
    if cell.shape[0]:
        sums = np.bincount(cell, weights=np.concatenate(values), minlength=n_bars * LEVELS)
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


def _book_rows(bid: np.ndarray, ask: np.ndarray, bid_sizes: np.ndarray, ask_sizes: np.ndarray) -> np.ndarray:
    """:data:`BOOK_INTS` of ``n`` books, int64 ``(n, len(BOOK_INTS))``, from their best prices
    (``(n,)``) and level sizes (contracts, level-major ``(LEVELS, n)``); both paths use it."""
    n = bid.shape[0]
    depth = np.empty((LEVELS, 2, n), np.int64)  # level-major: bid, ask contracts
    depth[:, 0] = bid_sizes
    depth[:, 1] = ask_sizes
    for k in range(1, LEVELS):  # summed over levels 1..k+1: whole-array adds (cumsum along a
        depth[k] += depth[k - 1]  # short axis is slower)
    out = np.empty((n, len(BOOK_INTS)), np.int64)
    out[:, 0] = bid
    out[:, 1] = ask
    out[:, 2:4] = depth[0].T
    out[:, 4:].reshape(n, 2, len(_DEPTH_COLS))[:] = depth[_DEPTH_COLS].transpose(2, 1, 0)
    return out


def _bar_frames(
    parts: Sequence[tuple[InstrumentSpec, int]],
    *,
    close_ts: np.ndarray,
    close_ts_before: np.ndarray,
    mid2: np.ndarray,
    mid2_before: np.ndarray,
    book: np.ndarray,
    signed_volume: np.ndarray,
    volume: np.ndarray,
    trades: np.ndarray,
    rv_half_ticks2: np.ndarray,
    ofi: np.ndarray,
    n_records: np.ndarray,
    close_index: np.ndarray,
    tradable: np.ndarray,
) -> list[BarFrame]:
    """The :class:`BarFrame` of ``n`` closed bars from their sufficient statistics: the one
    definition of every feature, used by both paths (the incremental path hands over the bars
    that one batch of records closed, of every instrument at once). ``parts``: the instrument of
    each run of rows and its number of rows, in row order; one frame per part.

    All inputs are int64 ``(n,)`` unless said otherwise. ``close_ts``/``close_ts_before``: this
    close and the previous one (UNIX ns; the first bar passes its own close); ``mid2``/
    ``mid2_before``: best bid + best ask (fixed point) of the last healthy record at this close
    and at the previous one (0: none yet); ``book``: :data:`BOOK_INTS` at the close,
    ``(n, len(BOOK_INTS))``; ``rv_half_ticks2``: sum over the bar of the squared
    record-to-record change of ``mid2`` in ticks (twice the mid in ticks); ``ofi``: ``(n,
    LEVELS)`` contracts; ``tradable``: bool.

    Book features: ``spread_ticks = (a - b) / tick``; ``microprice_offset_ticks`` = (microprice
    - mid) / tick = ``spread_ticks * (qb - qa) / (2 (qb + qa))`` (microprice ``(b qa + a qb) /
    (qa + qb)``); ``depth_imbalance_lk = (B_k - A_k) / (B_k + A_k)``; ``log_depth_*_l10 =
    log1p(size on 10 levels)``; every ratio is 0 when its denominator is 0 (no book yet).

    The features other than OFI are computed as rows of one float64 array (:data:`_SCALAR_NAMES`
    order) and cast into the float32 matrix in two block copies: with a batch of a few bars
    (the incremental path) NumPy's per-call cost is what counts."""
    ticks = [tick_fixed(spec.tick_size) for spec, _ in parts]
    tick: Any = ticks[0] if len(parts) == 1 else np.repeat(ticks, [count for _, count in parts])
    n = close_ts.shape[0]
    bid, ask, qb, qa = book[:, 0], book[:, 1], book[:, 2], book[:, 3]
    rows = np.empty((len(_SCALAR_NAMES), n))
    (mid_logret, mid_change, spread, microprice, signed_row, volume_row, trades_row, rv_row, count_row) = (
        rows[_ROW[name]]
        for name in (
            "mid_logret",
            "mid_change_ticks",
            "spread_ticks",
            "microprice_offset_ticks",
            "trade_volume_signed",
            "trade_volume",
            "trade_count",
            "realized_var_ticks2",
            "update_count",
        )
    )
    ok = (mid2 > 0) & (mid2_before > 0)
    np.divide(np.where(ok, mid2, 1), np.where(ok, mid2_before, 1), out=mid_logret)
    np.log(mid_logret, out=mid_logret)
    np.divide(np.where(ok, mid2 - mid2_before, 0), 2 * tick, out=mid_change)
    np.divide(ask - bid, tick, out=spread)
    top = qb + qa
    np.multiply(spread, qb - qa, out=microprice)
    np.divide(microprice, 2 * np.where(top > 0, top, 1), out=microprice)
    depth = book[:, 4:].T  # (8, n): bid levels 1, 3, 5, 10, then ask
    total = depth[:4] + depth[4:]
    np.divide(
        depth[:4] - depth[4:], np.where(total > 0, total, 1), out=rows[_ROW["depth_imbalance_l1"] :][:4]
    )
    signed_row[:] = signed_volume
    volume_row[:] = volume
    trades_row[:] = trades
    np.divide(rv_half_ticks2, 4, out=rv_row)
    count_row[:] = n_records
    log_depth = rows[_ROW["log_depth_bid_l10"] :][:2]
    log_depth[:] = depth[[3, 7]]
    np.log1p(log_depth, out=log_depth)
    np.divide(close_ts - close_ts_before, 1e9, out=rows[_ROW["bar_seconds"]])
    angle = (close_ts % _DAY_NS) * (_TWO_PI / _DAY_NS)
    np.sin(angle, out=rows[_ROW["tod_sin"]])
    np.cos(angle, out=rows[_ROW["tod_cos"]])

    feats = np.empty((n, _F), np.float32)
    feats[:, :_OFI_COL] = rows[:_OFI_COL].T
    feats[:, _OFI_COL : _OFI_COL + LEVELS] = ofi
    feats[:, _OFI_COL + LEVELS] = ofi.sum(axis=1)
    feats[:, _OFI_COL + LEVELS + 1 :] = rows[_OFI_COL:].T
    mid = bid + ask
    prices = np.divide(book[:, :2].T, PRICE_SCALE)  # bid, ask
    mid_ticks, mid_price = mid / (2 * tick), mid / (2 * PRICE_SCALE)
    bid_size, ask_size = qb.copy(), qa.copy()
    frames = []
    start = 0
    for spec, count in parts:
        part = slice(start, start + count)
        start += count
        frames.append(
            BarFrame(
                instrument_id=spec.instrument_id,
                symbol=spec.symbol,
                ts_close=close_ts[part],
                features=feats[part],
                mid_ticks=mid_ticks[part],
                mid_price=mid_price[part],
                spread_ticks=spread[part],
                bid_price=prices[0, part],
                ask_price=prices[1, part],
                bid_size=bid_size[part],
                ask_size=ask_size[part],
                close_index=close_index[part],
                n_records=n_records[part],
                tradable=tradable[part],
            )
        )
    return frames


def _kernel(
    records: np.ndarray,
    plan: BarPlan,
    carry: _Carry,
    *,
    spec: InstrumentSpec,
    health: HealthConfig,
    monitor: HealthMonitor,
    index_base: np.ndarray,
    ts: np.ndarray,
    clock: np.ndarray,
) -> tuple[BarFrame, _Carry]:
    """The vectorised path: features of the bars of ``plan`` over ``records`` (one instrument,
    exactly the records of those bars, in arrival order, contiguous). ``index_base`` maps local
    record indices to ``close_index`` (int64 ``(n,)``, positions in the stream); ``ts`` is the
    records' ``ts_recv`` and ``clock`` its running maximum from the stream's start (int64
    ``(n,)``, computed by the caller for the bar plan). Returns the frame and the carry for the
    next group of bars."""
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
        words = records.view(np.int64).reshape(n, _WORDS)
        bid = words[:, _BID_PX[0]].copy()
        ask = words[:, _ASK_PX[0]].copy()
        faults = record_faults(records, bid, ask, prev=carry.prev, tick=tick, config=health)
        # stale silences between records (replay clock = the records' own ts_recv)
        prev_clock = np.empty(n, np.int64)
        prev_clock[0] = carry.last_clock
        prev_clock[1:] = clock[:-1]
        silent = np.flatnonzero((ts - prev_clock > stale_ns) & (prev_clock > 0))
        for i in silent.tolist():
            monitor.silence(int(prev_clock[i]), int(ts[i]), stale_ns)
        monitor.observe(ts, faults)
        ok = (faults & RECORD_FAULTS) == 0

        bar_of = np.repeat(np.arange(n_bars), ends - starts)  # the bar of each record
        pair_ok = ok.copy()
        pair_ok[1:] &= ok[:-1]
        pair_ok[0] &= carry.last_ok or carry.last_words is None
        ofi = _bar_ofi(words, carry.last_words, pair_ok, ends, bar_of)

        # trades (action T, side = aggressor) and unhealthy records, sparse: per-bar sums over
        # their positions
        codes = records.view(MBP10_CODES)
        trades = np.flatnonzero(codes["action"] == _TRADE)
        size = records["size"][trades].astype(np.int64)
        side = codes["side"][trades]
        volumes = np.empty((trades.shape[0], 2), np.int64)
        np.subtract(size * (side == _BID), size * (side == _ASK), out=volumes[:, 0])
        volumes[:, 1] = size
        trade_ends = np.searchsorted(trades, ends)
        trade_starts = np.empty_like(trade_ends)
        trade_starts[0] = 0
        trade_starts[1:] = trade_ends[:-1]
        signed_volume, volume = _bar_sums(volumes, trade_starts, trade_ends).T
        n_trades = trade_ends - trade_starts
        n_bad = np.diff(np.searchsorted(np.flatnonzero(~ok), ends), prepend=0)

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
        signed_volume = volume = n_trades = n_bad = rv = np.zeros(n_bars, np.int64)

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
        sizes = _size_words(words)[rows].T
        book[with_book] = _book_rows(bid[rows], ask[rows], sizes & _LOW32, sizes >> 32)
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

    tradable = (n_bad == 0) & last_ok_bar & has_book & (close_ts - last_clock <= stale_ns)
    tradable &= last_clock > 0

    close_index = np.where(has_rec, index_base[np.maximum(last, 0)], carry.last_index)

    (frame,) = _bar_frames(
        [(spec, n_bars)],
        close_ts=close_ts,
        close_ts_before=prev_close_ts,
        mid2=close_mid2,
        mid2_before=close_mid2_before,
        book=book,
        signed_volume=signed_volume,
        volume=volume,
        trades=n_trades,
        rv_half_ticks2=rv,
        ofi=ofi,
        n_records=(ends - starts).astype(np.int64),
        close_index=close_index.astype(np.int64),
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
        nxt.prev = prev_top_of(records, bid, ask, int(clock[-1]))
        nxt.last_words = words[-1].copy()
    return frame, nxt


def _check_records(records: np.ndarray) -> None:
    if not isinstance(records, np.ndarray) or records.dtype != MBP10_DTYPE or records.ndim != 1:
        raise FeedError("expected a 1-D array of MBP-10 records (feeds.records.MBP10_DTYPE)")


def _stale_ns(health: HealthConfig) -> int:
    if not health.stale_after_s > 0:
        raise FeedError(f"feeds.health.stale_after_s must be positive, got {health.stale_after_s!r}")
    return round(health.stale_after_s * 1e9)


_NO_ID = -1
"""The instrument id :class:`FeatureStream` gives a record that is not MBP-10 (real ids are
uint32)."""
_GROUP_RECORDS = 1 << 13
"""The vectorised path runs the kernel over groups of whole bars of about this many records
(~3 MB): each group's records are gathered from the chunk just before the kernel reads them,
so they are still in cache (gathering a whole chunk first made every later strided read a
miss); small temporaries are reused, and the carry makes the grouping invisible."""
FILE_CHUNK_RECORDS = 1 << 16
""":func:`compute_file` reads this many records at a time by default (24 MiB)."""


class _InstrumentStream:
    """The vectorised path for one instrument over records that arrive in chunks: the kernel's
    carry, and the records of the open bar (held back until a later chunk closes it)."""

    def __init__(
        self, spec: InstrumentSpec, bars: BarConfig, health: HealthConfig, monitor: HealthMonitor
    ) -> None:
        self.spec = spec
        self.monitor = monitor
        self._bars = bars
        self._health = health
        self._stale_ns = _stale_ns(health)
        self._carry = _Carry()
        self._tail = np.empty(0, MBP10_DTYPE)  # the open bar's records
        self._tail_index = np.empty(0, np.int64)  # their positions in the stream
        self._clock_before = 0  # running maximum of ts_recv before the open bar
        self._frames: list[BarFrame] = []

    def push(self, chunk: np.ndarray, positions: np.ndarray | None, offset: int) -> None:
        """Add this instrument's records of ``chunk`` (contiguous :data:`MBP10_DTYPE`): all of
        them when ``positions`` is ``None``, else ``chunk[positions]``. ``offset`` is the
        chunk's position in the stream (for ``close_index``)."""
        local = np.arange(len(chunk), dtype=np.int64) if positions is None else positions
        if not len(local):
            return
        tail = self._tail
        index = np.concatenate((self._tail_index, local + offset))
        mine = chunk["ts_recv"] if positions is None else chunk["ts_recv"][positions]
        ts = np.concatenate((tail["ts_recv"], mine)).astype(np.int64)
        clock = np.maximum.accumulate(np.maximum(ts, self._clock_before))
        plan = plan_bars(clock, self._bars, self._stale_ns)
        n_bars = plan.ends.shape[0]
        used = int(plan.ends[-1]) if n_bars else 0
        if n_bars:
            targets = np.arange(_GROUP_RECORDS, used, _GROUP_RECORDS)
            cuts = np.unique(np.searchsorted(plan.ends, targets, side="left") + 1)
            bounds = [0, *cuts[cuts < n_bars].tolist(), n_bars]
            for b0, b1 in itertools.pairwise(bounds):
                r0 = int(plan.ends[b0 - 1]) if b0 else 0
                r1 = int(plan.ends[b1 - 1])
                part = BarPlan(ends=plan.ends[b0:b1] - r0, close_ts=plan.close_ts[b0:b1])
                frame, self._carry = _kernel(
                    _gather(tail, chunk, positions, r0, r1),  # gathered just before use: in cache
                    part,
                    self._carry,
                    spec=self.spec,
                    health=self._health,
                    monitor=self.monitor,
                    index_base=index[r0:r1],
                    ts=ts[r0:r1],
                    clock=clock[r0:r1],
                )
                self._frames.append(frame)
            self._clock_before = int(clock[used - 1])
        self._tail = _gather(tail, chunk, positions, used, len(index))
        self._tail_index = index[used:]

    def frame(self) -> BarFrame:
        """The bars closed so far (the open bar's records are not used)."""
        frames = self._frames
        if not frames:
            return BarFrame.empty(self.spec.instrument_id, self.spec.symbol)
        if len(frames) > 1:
            self._frames = [BarFrame.concat(frames)]
        return self._frames[0]


def _gather(
    tail: np.ndarray, chunk: np.ndarray, positions: np.ndarray | None, r0: int, r1: int
) -> np.ndarray:
    """Records ``[r0, r1)`` of ``tail`` followed by ``chunk[positions]`` (all of ``chunk`` when
    ``None``), contiguous: a view when they lie in one of the two, else one new array; records
    move as int64 words (NumPy moves structured rows field by field)."""
    n_tail = len(tail)
    head = tail[min(r0, n_tail) : min(r1, n_tail)]
    begin, end = max(r0 - n_tail, 0), max(r1 - n_tail, 0)
    if begin == end:
        return head
    if positions is None and not len(head):
        return chunk[begin:end]
    n_head = len(head)
    out = np.empty(n_head + end - begin, MBP10_DTYPE)
    words = out.view(np.int64).reshape(len(out), _WORDS)
    words[:n_head] = head.view(np.int64).reshape(n_head, _WORDS)
    source = chunk.view(np.int64).reshape(len(chunk), _WORDS)
    if positions is None:
        words[n_head:] = source[begin:end]
    else:
        np.take(source, positions[begin:end], axis=0, out=words[n_head:], mode="clip")  # valid by
        # construction; mode 'raise' would buffer the output
    return out


class FeatureStream:
    """The vectorised path over a stream of record chunks (a file or an archive read in bounded
    memory): :meth:`push` each chunk in arrival order, then :meth:`result`. The bars and
    features do not depend on how the records are cut into chunks; :func:`compute_all` is one
    chunk. Records of an instrument that is not configured, or not MBP-10, are counted."""

    def __init__(self, instruments: Iterable[InstrumentSpec], bars: BarConfig, health: HealthConfig) -> None:
        self._streams = [
            _InstrumentStream(spec, bars, health, HealthMonitor(spec.instrument_id, spec.symbol))
            for spec in instruments
        ]
        self._offset = 0
        self._rejected = 0

    def push(self, records: np.ndarray) -> None:
        """Add the next chunk (1-D :data:`MBP10_DTYPE`, any instruments, arrival order)."""
        _check_records(records)
        chunk = np.ascontiguousarray(records)  # the kernel views records as int64 words
        ids = chunk["instrument_id"].astype(np.int64)  # read once, then contiguous
        ids[~mbp10_header_ok(chunk)] = _NO_ID
        valid = np.zeros(chunk.shape[0], bool)
        for stream in self._streams:
            mine = ids == stream.spec.instrument_id
            valid |= mine
            positions = None if mine.all() else np.flatnonzero(mine)
            stream.push(chunk, positions, self._offset)
        self._rejected += int(chunk.shape[0] - np.count_nonzero(valid))
        self._offset += chunk.shape[0]

    def result(self) -> FeatureSet:
        """The bars closed so far, a health monitor per symbol, and the rejected records."""
        return FeatureSet(
            {s.spec.symbol: s.frame() for s in self._streams},
            {s.spec.symbol: s.monitor for s in self._streams},
            self._rejected,
        )


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
    chunk = np.ascontiguousarray(records)
    stream = _InstrumentStream(
        instrument, bars, health, monitor or HealthMonitor(instrument.instrument_id, instrument.symbol)
    )
    mine = (chunk["instrument_id"] == instrument.instrument_id) & mbp10_header_ok(chunk)
    stream.push(chunk, None if mine.all() else np.flatnonzero(mine), 0)
    return stream.frame()


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
    stream = FeatureStream(instruments, bars, health)
    stream.push(records)
    return stream.result()


def compute_file(
    path: str | Path,
    instruments: Iterable[InstrumentSpec],
    bars: BarConfig,
    health: HealthConfig,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    chunk_records: int = FILE_CHUNK_RECORDS,
) -> FeatureSet:
    """:func:`compute_all` over a DBN file or a directory of daily files (time-disjoint, as
    :func:`feeds.dbn.iter_mbp10` reads them), decoded and processed ``chunk_records`` records
    at a time: memory stays bounded by a chunk plus the bars. ``start_ns``/``end_ns`` keep
    ``start_ns <= ts_recv < end_ns``. ``close_index`` counts records from the first one kept.
    Raises :class:`~feeds.errors.DBNFormatError` on unreadable files."""
    stream = FeatureStream(instruments, bars, health)
    for chunk in iter_mbp10(path, chunk_records=chunk_records, start_ns=start_ns, end_ns=end_ns):
        stream.push(chunk)
    return stream.result()


_REC = struct.Struct("<BB2xI8xqIcc2xQ4xI" + "qqII8x" * LEVELS)
"""What the incremental path reads of an MBP-10 record, as Python values: header and event
fields (0-8, see ``_F_*``), then level ``k`` at ``9 + 4k``: bid_px, ask_px, bid_sz, ask_sz.
Fields it does not use (publisher, ts_event, flags, depth, ts_in_delta, the order counts) are
skipped: each value unpacked is a Python object made per record."""
assert _REC.size == MBP10_DTYPE.itemsize
_RECORD_SIZE = MBP10_DTYPE.itemsize
_IID = struct.Struct("<4xI")
# positions in an unpacked record
_F_LENGTH, _F_RTYPE, _F_IID, _F_PRICE, _F_SIZE = 0, 1, 2, 3, 4
_F_ACTION, _F_SIDE, _F_TS, _F_SEQ = 5, 6, 7, 8
_F_BID, _F_ASK, _F_BID_SZ, _F_ASK_SZ = 9, 10, 11, 12  # top of book
_BIDS, _ASKS, _BID_SZS, _ASK_SZS = (slice(i, None, 4) for i in (_F_BID, _F_ASK, _F_BID_SZ, _F_ASK_SZ))


_ARRAY_MASKS = 48
"""A pushed batch of at least this many records of one instrument gets its fault bits from the
array form of the record rules at once (:func:`feeds.health.record_faults`: ~100 us, mostly
NumPy's per-call costs); a smaller one from the scalar form, record by record (~2.2 us each).
Measured break-even: ~45 records."""


# a closed bar waiting for its frame (IncrementalBars._closed), all ints: its statistics, the
# book at its close and the sizes at its last record (the book and the order-flow imbalance of
# the bars one call closes are computed together, as arrays)
_P_CLOSE, _P_BEFORE, _P_MID2, _P_MID2_BEFORE, _P_SIGNED, _P_VOLUME, _P_TRADES, _P_RV = range(8)
_P_N, _P_INDEX, _P_TRADABLE = 8, 9, 10
_P_BOOK = 11  # the last healthy record's bid, ask, bid sizes, ask sizes (zeros before one)
_P_END = _P_BOOK + 2 + 2 * LEVELS  # bid sizes, ask sizes of the bar's last record
_P_OFI = _P_END + 2 * LEVELS  # the price-change corrections and excluded pairs of the bar


class IncrementalBars:
    """The incremental path for one instrument: push raw records one at a time, get the bars
    they close (the same bars and features as :func:`compute_bars` on the same records).

    ``push`` takes the 368 raw bytes of one MBP-10 record (what a NATS message carries; from an
    array, :meth:`push_records`). Per record it unpacks the fields once and updates the open
    bar's sufficient statistics in plain Python with the shared definitions (the record rules,
    :func:`fault_mask` on one record, or :func:`feeds.health.record_faults` on a pushed batch at
    once; :func:`ofi_price_term`); a bar that closes leaves its statistics (integers) and the
    sizes of its last record and of its book, and the bars closed by one call become one
    :class:`BarFrame` through the array functions the vectorised path uses (:func:`_book_rows`,
    :func:`_bar_frames`; the telescoped size change of the order flow as one array difference),
    so a batch of records pays NumPy's per-call costs once, not per bar. :meth:`poll` with the
    caller's clock (simulated in replay) closes due time bars and opens stale episodes;
    :meth:`report_gap` takes a transport gap (the open bar is not tradable). Record-check
    episodes reach :attr:`monitor` when the bar closes (the decision point), stale and gap
    episodes at once.
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
        self._event_clock = bars.clock == "events"
        # the previous record, and its bid and ask prices
        self._last: tuple[Any, ...] | None = None
        self._bids: tuple[int, ...] = ()
        self._asks: tuple[int, ...] = ()
        self._last_ok = False
        # the last healthy record and the previous close
        self._healthy: tuple[Any, ...] | None = None
        self._book: tuple[int, ...] = (0,) * (_P_END - _P_BOOK)  # the book part of a bar's row
        self._book_of: tuple[Any, ...] | None = None
        self._mid2 = 0
        self._half_ticks = 0
        self._close_mid2 = 0
        self._close_ts = 0
        self._close_index = -1
        self._end_sizes: tuple[int, ...] = (0,) * 2 * LEVELS  # at the previous bar's last record
        self._net_taken: Any = np.zeros(LEVELS, np.int64)  # bid - ask sizes at the last bar taken
        self._closed: list[tuple[int, ...]] = []  # bars closed by the current call
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
            bid_px=f[_BIDS],
            ask_px=f[_ASKS],
            bid_sz=f[_BID_SZS],
            ask_sz=f[_ASK_SZS],
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
        self._add(f, self._mask(f))
        return self._take_frame()

    def push_records(self, records: np.ndarray) -> list[BarFrame]:
        """:meth:`push` each record of ``records`` (this instrument only, arrival order); the bars
        they close, as one frame in close order (an empty list when none closed).

        Raises like :meth:`push`, before adding any record, when one record is not an MBP-10
        record of this instrument."""
        _check_records(records)
        contiguous = np.ascontiguousarray(records)
        bad = ~mbp10_header_ok(contiguous) | (contiguous["instrument_id"] != self.spec.instrument_id)
        if bad.any():
            self.push(contiguous[int(np.argmax(bad))].tobytes())  # raises the error push() gives
        self._add_records(contiguous)
        return _take_closed([self])

    def _add_records(self, records: np.ndarray) -> None:
        """:meth:`_add` each of ``records`` (contiguous, checked, this instrument's): their fault
        bits from the array form of the record rules at once, or record by record as
        :meth:`push` judges them when they are fewer than :data:`_ARRAY_MASKS`."""
        add = self._add
        unpacked = _REC.iter_unpack(records.data.cast("B"))
        if records.shape[0] < _ARRAY_MASKS:
            for f in unpacked:
                add(f, self._mask(f))
            return
        for f, mask in zip(unpacked, self._masks_of(records), strict=True):
            add(f, mask)

    def poll(self, now_ns: int) -> BarFrame | None:
        """Judge the feed at the caller's clock ``now_ns`` (UNIX ns): open a stale episode when
        nothing came for ``stale_after_s`` and close the time bars due strictly before now."""
        clock = self._clock.clock_ts
        if self._last is not None and now_ns - clock > self._stale_ns:
            self._stale_open = True
            self.monitor.silence(clock, None, self._stale_ns)
        closes = self._clock.on_clock(now_ns)
        if closes:
            self._close(closes, clock)
        return self._take_frame()

    def _take_frame(self) -> BarFrame | None:
        """The frame of the bars closed since the last call (``None`` when none)."""
        frames = _take_closed([self])
        return frames[0] if frames else None

    def report_gap(self, at_ns: int) -> None:
        """The transport lost records at ``at_ns``: the open bar is not tradable and a gap
        episode runs until the next record."""
        self._gap = self._gap_open = True
        self.monitor.gap(at_ns)

    def _mask(self, f: tuple[Any, ...]) -> int:
        """The record rules' fault bits of one unpacked record (the next one to add)."""
        last = self._last
        ts = f[_F_TS]
        return int(
            fault_mask(
                bid=f[_F_BID],
                ask=f[_F_ASK],
                bid_sz=f[_F_BID_SZ],
                ask_sz=f[_F_ASK_SZ],
                trade_price=f[_F_PRICE] if f[_F_ACTION] == ACTION_TRADE else 1,
                ts=ts,
                clock_before=ts if last is None else self._clock.clock_ts,
                seq=f[_F_SEQ],
                seq_before=f[_F_SEQ] if last is None else last[_F_SEQ],
                bid_before=UNDEF_PRICE if last is None else valid_top(last[_F_BID]),
                ask_before=UNDEF_PRICE if last is None else valid_top(last[_F_ASK]),
                tick=self._tick,
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
            prev = PrevTop(
                self._clock.clock_ts, last[_F_SEQ], valid_top(last[_F_BID]), valid_top(last[_F_ASK])
            )
        bid = records["bid_px_00"].astype(np.int64)
        ask = records["ask_px_00"].astype(np.int64)
        masks: list[int] = record_faults(
            records, bid, ask, prev=prev, tick=self._tick, config=self._health
        ).tolist()
        return masks

    def _add(self, f: tuple[Any, ...], mask: int) -> None:
        """One unpacked, checked record of this instrument with its fault bits: update the open
        bar; a bar it closes goes to :attr:`_closed`."""
        ts = f[_F_TS]
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
            self._close(closes, clock_before)

        bids, asks = f[_BIDS], f[_ASKS]
        ok = mask == 0
        self._ts.append(ts)
        self._masks.append(mask)
        if last is not None:
            ofi = self._ofi
            if ok and self._last_ok:
                pb, pa = self._bids, self._asks
                if bids != pb:
                    q, pq = f[_BID_SZS], last[_BID_SZS]
                    for k in range(LEVELS):
                        if bids[k] != pb[k]:
                            ofi[k] += ofi_price_term(bids[k], pb[k], q[k], pq[k], bid=True)
                if asks != pa:
                    q, pq = f[_ASK_SZS], last[_ASK_SZS]
                    for k in range(LEVELS):
                        if asks[k] != pa[k]:
                            ofi[k] += ofi_price_term(asks[k], pa[k], q[k], pq[k], bid=False)
            else:  # a pair with an unhealthy record adds no flow
                bsz, asz, pqb, pqa = f[_BID_SZS], f[_ASK_SZS], last[_BID_SZS], last[_ASK_SZS]
                for k in range(LEVELS):
                    ofi[k] -= (bsz[k] - pqb[k]) - (asz[k] - pqa[k])
        else:  # the stream's first record starts the first bar's order flow
            self._end_sizes = f[_BID_SZS] + f[_ASK_SZS]
            self._net_taken = np.subtract(f[_BID_SZS], f[_ASK_SZS])
        if f[_F_ACTION] == ACTION_TRADE:
            size = f[_F_SIZE]
            self._trades += 1
            self._volume += size
            side = f[_F_SIDE]
            if side == SIDE_BID:
                self._signed += size
            elif side == SIDE_ASK:
                self._signed -= size
        if ok:
            mid2 = bids[0] + asks[0]
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
        self._bids, self._asks = bids, asks
        self._last_ok = ok
        self._n_open += 1
        self._n_seen += 1
        if self._event_clock and clock.after_record():
            self._close([clock.clock_ts], clock.clock_ts)

    def _close(self, closes: Sequence[int], last_clock: int) -> None:
        """Close the bars at ``closes``: the open bar (when it holds records) and empty bars;
        their statistics go to :attr:`_closed`. ``last_clock`` is the clock of the last record
        before the close."""
        if self._masks and (self._n_bad or self.monitor.failing_records()):
            self.monitor.observe(np.array(self._ts, np.int64), np.array(self._masks, np.uint8))
        for j, close in enumerate(closes):
            n = self._n_open if j == 0 else 0
            if n:
                last = self._last
                assert last is not None
                self._end_sizes = last[_BID_SZS] + last[_ASK_SZS]
                self._close_index = self._n_seen - 1
                stats = (self._signed, self._volume, self._trades, self._rv)
                ofi = self._ofi
                healthy = self._healthy
                if healthy is not self._book_of and healthy is not None:
                    self._book_of = healthy
                    self._book = (healthy[_F_BID], healthy[_F_ASK], *healthy[_BID_SZS], *healthy[_ASK_SZS])
            else:
                ofi = [0] * LEVELS
                stats = (0, 0, 0, 0)
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
                    *stats,
                    n,
                    self._close_index,
                    tradable,
                    *self._book,
                    *self._end_sizes,
                    *ofi,
                )
            )
            self._close_mid2 = self._mid2
            self._close_ts = close
            if j == 0:
                self._gap = False
                self._open_bar()


def _take_closed(builders: Sequence[IncrementalBars]) -> list[BarFrame]:
    """The frames of the bars that ``builders`` closed since they were last taken, one per
    builder that closed any, computed together (NumPy's per-call costs paid once per batch)."""
    closing = [b for b in builders if b._closed]
    if not closing:
        return []
    rows = np.array([row for b in closing for row in b._closed], np.int64)
    counts = [len(b._closed) for b in closing]
    # order-flow imbalance: the size change over the bar (telescoped) plus the corrections
    net = rows[:, _P_END : _P_END + LEVELS] - rows[:, _P_END + LEVELS : _P_OFI]
    net_before = np.empty_like(net)
    net_before[1:] = net[:-1]
    start = 0
    for builder, count in zip(closing, counts, strict=True):
        net_before[start] = builder._net_taken  # each builder's first bar follows its own last one
        start += count
        builder._net_taken = net[start - 1]
        builder._closed = []
    ofi = net - net_before + rows[:, _P_OFI:]
    healthy = rows[:, _P_BOOK:_P_END]
    book = _book_rows(healthy[:, 0], healthy[:, 1], healthy[:, 2 : 2 + LEVELS].T, healthy[:, 2 + LEVELS :].T)
    return _bar_frames(
        [(b.spec, count) for b, count in zip(closing, counts, strict=True)],
        close_ts=rows[:, _P_CLOSE].copy(),
        close_ts_before=rows[:, _P_BEFORE],
        mid2=rows[:, _P_MID2],
        mid2_before=rows[:, _P_MID2_BEFORE],
        book=book,
        signed_volume=rows[:, _P_SIGNED],
        volume=rows[:, _P_VOLUME],
        trades=rows[:, _P_TRADES],
        rv_half_ticks2=rows[:, _P_RV],
        ofi=ofi,
        n_records=rows[:, _P_N].copy(),
        close_index=rows[:, _P_INDEX].copy(),
        tradable=rows[:, _P_TRADABLE] != 0,
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
        self._ids = np.array(sorted(self.by_id), np.uint32)
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
        """Route every record of ``records`` (any instruments, arrival order); the bars they
        close, one frame per instrument that closed any (bars in close order)."""
        _check_records(records)
        contiguous = np.ascontiguousarray(records)
        ids = contiguous["instrument_id"]
        known = (ids[:, None] == self._ids).any(axis=1)  # np.isin is 3x slower on a batch
        good = mbp10_header_ok(contiguous) & known
        if not good.all():
            self.rejected += int(good.shape[0] - np.count_nonzero(good))
            contiguous = take_mbp10(contiguous, good)
            ids = contiguous["instrument_id"]
        if not len(ids):
            return []
        by_id = self.by_id
        if len(ids) < _ARRAY_MASKS * len(by_id):  # a few records per instrument: route each one
            for f in _REC.iter_unpack(contiguous.data.cast("B")):
                builder = by_id[f[_F_IID]]
                builder._add(f, builder._mask(f))
        else:
            for iid, builder in by_id.items():  # instruments are independent: one at a time
                mine = ids == iid
                if mine.all():
                    builder._add_records(contiguous)
                elif mine.any():
                    builder._add_records(take_mbp10(contiguous, mine))
        return _take_closed(list(by_id.values()))

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
                if builder._clock.would_close(pending[iid], latest):
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
