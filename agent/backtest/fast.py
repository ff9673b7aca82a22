"""The vectorised backtest driver: bars from the vectorised feature path, windows in lockstep.

1. The records of the window are decoded in chunks, in the order the replay source yields them
   (:func:`feeds.dbn.iter_mbp10`), and reduced to bars and causal features by
   :class:`feeds.features.FeatureStream` (bit-identical to the daemon's incremental path).
2. The regime scale of every bar is stepped with the daemon's :class:`RegimeTracker`.
3. Each instrument's bars are cut into ``chunks`` contiguous spans; every span is one engine
   slot and all spans step in lockstep, one batched decision per step. A span after the first
   re-reads the ``K - 1`` bars before it to fill its window (no trade there), starts flat and is
   closed flat at its last bar. With ``chunks = 1`` there is one slot per instrument and the run
   is exactly the event-driven one (same decisions, Thompson draws, fills and P&L: the parity
   test); more chunks trade a little fidelity (chunk edges) for batch throughput.
4. A bar's decision is taken when the record that closes it arrives (the instrument's first
   record after the close); its order meets the book as it stands ``broker.latency_ms`` after
   that record (the instrument's last record at or before then) and is filled at once by
   :func:`agent.execution.fills.walk_book` and :func:`agent.execution.fills.execution_price`,
   the paper broker's maths: same levels, same partial fills, same fill rule
   (``broker.fill_price``), rounding and fees. The event-driven driver gives the same fills
   whenever an order executes before its instrument's next bar closes (always with zero
   latency).

Of the trading step's rules it applies the decision, the position clamp
(:meth:`agent.trading.risk.RiskLimits.clamp_targets`) and the order as the difference to the
position; it sends market orders only. The order-rate limit and the daily-loss and drawdown
halt act across instruments in time order, which spans stepped in lockstep do not follow: they
are not simulated here. :func:`agent.backtest.api.run_backtest` replays the run's path through
them afterwards (:func:`agent.trading.risk.first_binding`) and refuses a run in which one would
have acted, and refuses ``--fast`` with limit orders up front.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from agent.backtest.books import DecisionLog
from agent.backtest.errors import BacktestError
from agent.config import Config
from agent.execution.config import FillPrice
from agent.execution.fills import (
    PositionArrays,
    apply_fills,
    execution_price,
    fees,
    order_schedule,
    walk_book,
)
from agent.policy.observation import observation_rows
from agent.policy.regime import RegimeTracker
from agent.trading.decider import Decider
from agent.trading.risk import RiskLimits
from feeds.book import LEVEL_DTYPE, book_levels, tick_fixed
from feeds.config import FeedsConfig, InstrumentSpec
from feeds.dbn import iter_mbp10
from feeds.features import FEATURE_NAMES, BarFrame, FeatureStream
from feeds.records import LEVELS, PRICE_SCALE

__all__ = ["BarSet", "FastRun", "FillList", "MetBooks", "load_bars", "marks_of", "regime_path", "run_fast"]

_LOGRET = FEATURE_NAMES.index("mid_logret")
_LEVEL_FIELDS = ("bid_px", "bid_sz", "ask_px", "ask_sz")
_KEYS = np.dtype([("instrument_id", "<u4"), ("ts_recv", "<u8")])
_CHUNK_RECORDS = 1 << 16
""":func:`load_bars` decodes this many records at a time (24 MiB)."""


@dataclass(frozen=True)
class MetBooks:
    """Per bar of one instrument, the book its order meets as the paper broker has it, and
    whether that order would be late (:func:`agent.execution.fills.order_schedule`)."""

    levels: dict[str, np.ndarray[Any, Any]]
    """``bid_px``, ``bid_sz``, ``ask_px``, ``ask_sz``: ``[bars, LEVELS]``."""
    late: np.ndarray[Any, Any]


@dataclass(frozen=True)
class BarSet:
    """The bars of every instrument over the backtest window and the books their orders meet
    (the records they came from are not kept: 368 bytes each, a million in a few days)."""

    frames: dict[str, BarFrame]
    books: dict[str, MetBooks]
    latency_ms: float
    """The order latency the books were met at (``broker.latency_ms``)."""
    n_records: int
    rejected_records: int
    health_episodes: dict[str, int]


def load_bars(
    path: str | Path,
    specs: Sequence[InstrumentSpec],
    feeds: FeedsConfig,
    start_ns: int,
    end_ns: int,
    *,
    latency_ms: float,
) -> BarSet:
    """Bars and features of ``specs`` from the records of ``path`` in ``[start_ns, end_ns)``, on
    the ``[feeds]`` bar clock and health rules, and the book each bar's order meets after
    ``latency_ms``.

    The file is decoded once, in chunks in feed order (as the replay source yields them): each
    chunk goes through the vectorised features (:class:`feeds.features.FeatureStream`, the same
    bars as :func:`feeds.features.compute_all` over the whole array) as it is decoded, and is
    kept for the books the orders meet. No whole-window array is assembled: a copy of every
    record would cost as much as the decoding (a counting pass and a copy, ~0.4 s a million)."""
    stream = FeatureStream(specs, feeds.bars, feeds.health)
    chunks: list[np.ndarray[Any, Any]] = []
    for chunk in iter_mbp10(path, chunk_records=_CHUNK_RECORDS, start_ns=start_ns, end_ns=end_ns):
        stream.push(chunk)
        chunks.append(chunk)
    if not chunks:
        raise BacktestError(f"{path}: no MBP-10 records between the selected dates")
    result = stream.result()
    empty = [s.symbol for s in specs if len(result.frames[s.symbol]) == 0]
    if empty:
        raise BacktestError(f"{path}: no bars for {', '.join(empty)} in the selected dates")
    first = np.cumsum([0, *(len(c) for c in chunks)])
    keys = np.empty(int(first[-1]), _KEYS)  # what order_schedule reads of every record
    for name in _KEYS.names or ():
        np.concatenate([c[name] for c in chunks], out=keys[name])
    books = {}
    for s in specs:
        schedule = order_schedule(keys, s.instrument_id, result.frames[s.symbol].close_index, latency_ms)
        levels = _levels_at(chunks, first, schedule.rows)
        books[s.symbol] = MetBooks(levels={name: levels[name] for name in _LEVEL_FIELDS}, late=schedule.late)
    return BarSet(
        frames=result.frames,
        books=books,
        latency_ms=latency_ms,
        n_records=int(first[-1]),
        rejected_records=result.rejected_records,
        health_episodes={k: len(m.episodes) for k, m in result.monitors.items()},
    )


def _levels_at(
    chunks: Sequence[np.ndarray[Any, Any]], first: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """The book levels (:data:`feeds.book.LEVEL_DTYPE`, ``[len(rows), LEVELS]``) of the records at
    ``rows`` of the feed cut into ``chunks`` (chunk ``c`` starts at record ``first[c]``)."""
    out = np.empty((rows.shape[0], LEVELS), LEVEL_DTYPE)
    chunk_of = np.searchsorted(first, rows, side="right") - 1
    for c in np.unique(chunk_of).tolist():
        at = np.flatnonzero(chunk_of == c)
        out[at] = book_levels(chunks[c])[rows[at] - first[c]]
    return out


def marks_of(frame: BarFrame) -> np.ndarray[Any, Any]:
    """Bar-close mids in 1e-9 fixed point, carried forward over bars that are not tradable (the
    daemon marks positions only at trusted books); NaN before the first tradable bar."""
    mid = np.where(frame.tradable, frame.mid_price * PRICE_SCALE, np.nan)
    idx = np.where(frame.tradable, np.arange(mid.shape[0]), -1)
    np.maximum.accumulate(idx, out=idx)
    return np.where(idx >= 0, mid[np.maximum(idx, 0)], np.nan)


def regime_path(frames: Sequence[BarFrame], tracker: RegimeTracker) -> list[np.ndarray[Any, Any]]:
    """The regime scale at every bar of each frame (``tracker`` has one entry per frame), stepped
    bar by bar as the daemon steps it: a bar that is not tradable passes NaN (state kept)."""
    n = len(frames)
    longest = max(len(f) for f in frames)
    logret = np.full((longest, n), np.nan)
    for i, f in enumerate(frames):
        logret[: len(f), i] = np.where(f.tradable, f.features[:, _LOGRET].astype(np.float64), np.nan)
    out = tracker.path(logret)
    return [out[: len(f), i].copy() for i, f in enumerate(frames)]


@dataclass
class FillList:
    """Fills of a run, column-wise: instrument index, the decision bar that sent the order, time,
    signed quantity, price (1e-9 fixed point) and fee (currency)."""

    instrument: list[int]
    bar: list[int]
    ts_ns: list[int]
    qty: list[float]
    price: list[float]
    fee: list[float]

    @classmethod
    def empty(cls) -> FillList:
        return cls([], [], [], [], [], [])

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        return {
            "instrument": np.asarray(self.instrument, dtype=np.int64),
            "bar": np.asarray(self.bar, dtype=np.int64),
            "ts_ns": np.asarray(self.ts_ns, dtype=np.int64),
            "qty": np.asarray(self.qty, dtype=np.float64),
            "price": np.asarray(self.price, dtype=np.float64),
            "fee": np.asarray(self.fee, dtype=np.float64),
        }


def _spans(n_bars: int, chunks: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n_bars, min(chunks, n_bars) + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges.tolist()) if b > a]


class FastRun(NamedTuple):
    """What :func:`run_fast` produced."""

    log: DecisionLog
    fills: FillList
    per_row_s: float
    """Wall seconds spent in decisions per decision row (the amortised latency)."""
    late_orders: int
    """Orders that execute after their instrument's next decision
    (:func:`agent.execution.fills.order_schedule`): the event-driven driver decides that bar
    before the fill, this driver after it. With one
    span per instrument and none late (and no risk limit acting), both drivers agree exactly."""


class _Columns(NamedTuple):
    """The instruments' bars concatenated (``offsets[i] + bar`` indexes them), with each bar's
    execution record and whether its order would be late (:func:`agent.execution.fills.order_schedule`)."""

    offsets: np.ndarray[Any, Any]
    features: np.ndarray[Any, Any]
    tradable: np.ndarray[Any, Any]
    mid_ticks: np.ndarray[Any, Any]
    ts_close: np.ndarray[Any, Any]
    exec_levels: dict[str, np.ndarray[Any, Any]]
    """Per bar, the levels (bid_px, bid_sz, ask_px, ask_sz: ``[bars, LEVELS]``) of the book its
    order meets (:func:`agent.execution.fills.order_schedule`)."""
    late: np.ndarray[Any, Any]
    orderable: np.ndarray[Any, Any]
    """Bars closed together by one record (a gap closes empty bars too): only the last may
    trade, as in the daemon. An empty bar (no record) was closed by the record that closed the
    one before."""


def _columns(bars: BarSet, specs: Sequence[InstrumentSpec], frames: Sequence[BarFrame]) -> _Columns:
    books = [bars.books[s.symbol] for s in specs]  # an instrument may stand in several slots
    return _Columns(
        offsets=np.concatenate([[0], np.cumsum([len(f) for f in frames])]).astype(np.int64),
        features=np.concatenate([f.features for f in frames]),
        tradable=np.concatenate([f.tradable for f in frames]),
        mid_ticks=np.concatenate([f.mid_ticks for f in frames]).astype(np.float64),
        ts_close=np.concatenate([f.ts_close for f in frames]),
        exec_levels={name: np.concatenate([b.levels[name] for b in books]) for name in _LEVEL_FIELDS},
        late=np.concatenate([b.late for b in books]),
        orderable=np.concatenate([np.r_[f.n_records[1:] > 0, True] for f in frames]),
    )


def run_fast(
    bars: BarSet,
    specs: Sequence[InstrumentSpec],
    config: Config,
    decider: Decider,
    regimes: Sequence[np.ndarray[Any, Any]],
    *,
    chunks: int,
    on_step: Callable[[int, int], None] | None = None,
) -> FastRun:
    """Run ``decider`` over every bar.

    ``decider`` must serve ``len(specs) * chunks`` slots (slot = instrument * chunks + span).
    ``on_step(done, total)`` reports progress.
    """
    if chunks < 1:
        raise BacktestError(f"chunks must be >= 1, got {chunks}")
    if config.broker.latency_ms != bars.latency_ms:
        raise BacktestError(
            f"the bars' books were met at {bars.latency_ms} ms of latency, broker.latency_ms is "
            f"{config.broker.latency_ms}"
        )
    window = decider.window
    frames = [bars.frames[s.symbol] for s in specs]
    n_bars = np.asarray([len(f) for f in frames], dtype=np.int64)
    slots: list[tuple[int, int, int, int, int]] = []  # slot id, instrument, first bar read, first traded, end
    for i, frame in enumerate(frames):
        for c, (a, b) in enumerate(_spans(len(frame), chunks)):
            slots.append((i * chunks + c, i, a if c == 0 else max(0, a - (window - 1)), a, b))
    slot_id, inst, lo, start, hi = (np.asarray(col, dtype=np.int64) for col in zip(*slots, strict=True))
    cols = _columns(bars, specs, frames)
    offsets, feats, tradable, mid_ticks, ts_close = (
        cols.offsets,
        cols.features,
        cols.tradable,
        cols.mid_ticks,
        cols.ts_close,
    )
    late_orders = 0
    regime = np.concatenate(list(regimes))
    tick_px = np.asarray([float(tick_fixed(s.tick_size)) for s in specs])
    fee = config.broker.fee_per_contract
    risk = RiskLimits(config.risk)
    reward_scale = config.train.reward_scale

    n_slots = slot_id.shape[0]
    held = PositionArrays.flat(n_slots)
    log = DecisionLog()
    fills = FillList.empty()
    steps = int((hi - lo).max())
    spent = 0.0
    rows_decided = 0
    for step in range(steps):
        bar_all = lo + step
        active = np.flatnonzero(bar_all < hi)
        bar = bar_all[active]
        who_inst = inst[active]
        g = offsets[who_inst] + bar
        pos = held.position[active].astype(np.int64)
        rows = observation_rows(
            feats[g],
            positions=pos,
            entry_px=held.avg_price[active],
            mid_ticks=mid_ticks[g],
            tick_px=tick_px[who_inst],
            reward_scale=reward_scale,
        )
        t0 = time.perf_counter()
        decided = decider.decide(slot_id[active], rows, pos, regime[g], tradable[g])
        spent += time.perf_counter() - t0
        rows_decided += int(active.shape[0])
        live = bar >= start[active]
        target = risk.clamp_targets(decided.target)
        closing = (bar == hi[active] - 1) & (hi[active] < n_bars[who_inst])
        target = np.where(closing, 0, target)  # a span before the last one ends flat
        trade = live & (decided.valid | closing) & tradable[g] & cols.orderable[g] & (target != pos)
        log.add(
            ts_ns=ts_close[g][live],
            instrument=who_inst[live],
            bar=bar[live],
            decided=decided.take(live),
            regime=regime[g][live],
            position=pos[live],
            ordered=trade[live],
        )
        if trade.any():
            late_orders += int(cols.late[g[trade]].sum())
            held = _execute(
                levels={name: v[g[trade]] for name, v in cols.exec_levels.items()},
                qty=(target - pos)[trade].astype(np.float64),
                slots=active[trade],
                held=held,
                fee=fee,
                fill_price=config.broker.fill_price,
                out=fills,
                instrument=who_inst[trade],
                bar=bar[trade],
                ts_ns=ts_close[g[trade]],
            )
        if on_step is not None:
            on_step(step + 1, steps)
    return FastRun(log, fills, spent / max(rows_decided, 1), late_orders)


def _execute(
    *,
    levels: dict[str, np.ndarray[Any, Any]],
    qty: np.ndarray[Any, Any],
    slots: np.ndarray[Any, Any],
    held: PositionArrays,
    fee: float,
    fill_price: FillPrice,
    out: FillList,
    instrument: np.ndarray[Any, Any],
    bar: np.ndarray[Any, Any],
    ts_ns: np.ndarray[Any, Any],
) -> PositionArrays:
    """Market orders of signed size ``qty`` against the books ``levels``: the paper
    broker's book walk (IOC remainder dropped), priced by its fill rule and rounded to a
    fixed-point unit, fees per contract. Books the fills in ``held`` (one entry per slot) and
    appends them to ``out``."""
    fill = walk_book(levels["bid_px"], levels["bid_sz"], levels["ask_px"], levels["ask_sz"], qty)
    exec_px = execution_price(fill, levels["bid_px"][:, 0], levels["ask_px"][:, 0], fill_price)
    done = np.isfinite(exec_px)
    filled = np.where(done, np.asarray(fill.filled, dtype=np.float64), 0.0)
    price = np.where(done, np.rint(np.nan_to_num(exec_px)), 0.0)
    qty_all = np.zeros(held.position.shape[0])
    px_all = np.zeros(held.position.shape[0])
    qty_all[slots] = filled
    px_all[slots] = price
    out.instrument.extend(instrument[done].tolist())
    out.bar.extend(bar[done].tolist())
    out.ts_ns.extend(ts_ns[done].tolist())
    out.qty.extend(filled[done].tolist())
    out.price.extend(price[done].tolist())
    out.fee.extend(np.asarray(fees(filled[done], fee), dtype=np.float64).tolist())
    return apply_fills(held, qty_all, px_all)
