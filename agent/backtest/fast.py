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
4. A bar's decision is taken when the daemon's intake would close it
   (:func:`feeds.bars.decision_times`): when the record that closes it arrives (a time bar's
   instrument's first record after the close, an event bar's own last record), or on the clock
   ``daemon.close_grace_ms`` after a quiet time bar's close. Its order meets the book as it
   stands ``broker.latency_ms`` after that moment (the instrument's last record at or before
   then) and is filled at once by
   :func:`agent.execution.fills.walk_book` and :func:`agent.execution.fills.execution_price`,
   the paper broker's maths: same levels, same partial fills, same fill rule
   (``broker.fill_price``), rounding and fees. The event-driven driver gives the same fills
   whenever an order executes before its instrument's next bar is decided (always with zero
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
    closers,
    execution_price,
    fees,
    late_orders,
    walk_book,
)
from agent.policy.observation import observation_rows
from agent.policy.regime import RegimeTracker
from agent.trading.decider import Decided, Decider
from agent.trading.risk import RiskLimits
from feeds.bars import clock_closes, decision_times
from feeds.book import LEVEL_DTYPE, levels_at, tick_fixed
from feeds.config import BarConfig, FeedsConfig, InstrumentSpec
from feeds.dbn import iter_mbp10
from feeds.features import FEATURE_NAMES, BarFrame, FeatureStream
from feeds.features.vectorised import Closes
from feeds.records import LEVELS, PRICE_SCALE

__all__ = ["BarSet", "FastRun", "FillList", "MetBooks", "load_bars", "marks_of", "regime_path", "run_fast"]

_LOGRET = FEATURE_NAMES.index("mid_logret")
_CHUNK_RECORDS = 1 << 16
""":func:`load_bars` decodes this many records at a time (24 MiB)."""


@dataclass(frozen=True)
class MetBooks:
    """Per bar of one instrument, the book its order meets as the paper broker has it, and
    whether that order would be late (:func:`agent.execution.fills.order_schedule`)."""

    levels: np.ndarray[Any, Any]
    """:data:`feeds.book.LEVEL_DTYPE`, ``[bars, LEVELS]``."""
    late: np.ndarray[Any, Any]
    decided_ns: np.ndarray[Any, Any]
    """When each bar is decided and its order placed, on the feed clock (int64,
    :func:`feeds.bars.decision_times`)."""


@dataclass(frozen=True)
class BarSet:
    """The bars of every instrument over the backtest window and the books their orders meet
    (the records they came from are not kept: 368 bytes each, a million in a few days)."""

    frames: dict[str, BarFrame]
    books: dict[str, MetBooks]
    latency_ms: float
    """The order latency the books were met at (``broker.latency_ms``)."""
    close_grace_ns: int
    """The grace after which a quiet time bar is decided on the clock (``daemon.close_grace_ms``)."""
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
    close_grace_ns: int,
) -> BarSet:
    """Bars and features of ``specs`` from the records of ``path`` in ``[start_ns, end_ns)``, on
    the ``[feeds]`` bar clock and health rules, and the book each bar's order meets after
    ``latency_ms``, placed when the bar is decided (``close_grace_ns``: the daemon's grace,
    :func:`feeds.bars.decision_times`).

    The file is decoded once, in chunks in feed order (as the replay source yields them; a
    background thread decodes the next chunk meanwhile, :func:`feeds.dbn.reader.read_ahead`).
    Each chunk goes to the vectorised features (:class:`feeds.features.FeatureStream`, the same
    bars as :func:`feeds.features.compute_all` over the whole array), and the levels of the
    records the bars' orders meet are caught as they go by, with whether each order is late
    (:class:`_Catch`). Nothing of a record is kept past its chunk: the peak is a few chunks, the
    bars and their books, where keeping the records (368 bytes each) cost more memory than the
    books need."""
    stream = FeatureStream(specs, feeds.bars, feeds.health)
    catch = _Catch(specs, latency_ms, feeds.bars, close_grace_ns)
    offset = 0
    caught: tuple[np.ndarray[Any, Any], int, dict[int, Closes]] | None = None
    for chunk in iter_mbp10(path, chunk_records=_CHUNK_RECORDS, start_ns=start_ns, end_ns=end_ns, ahead=1):
        closes = stream.start(chunk)
        if caught is not None:  # while the workers compute this chunk's features
            catch.push(*caught)
        caught = (chunk, offset, closes())
        offset += len(chunk)
    if caught is None:
        raise BacktestError(f"{path}: no MBP-10 records between the selected dates")
    catch.push(*caught)
    result = stream.result()
    empty = [s.symbol for s in specs if len(result.frames[s.symbol]) == 0]
    if empty:
        raise BacktestError(f"{path}: no bars for {', '.join(empty)} in the selected dates")
    met = catch.finish([len(result.frames[s.symbol]) for s in specs])
    return BarSet(
        frames=result.frames,
        books={s.symbol: m for s, m in zip(specs, met, strict=True)},
        latency_ms=latency_ms,
        close_grace_ns=close_grace_ns,
        n_records=offset,
        rejected_records=result.rejected_records,
        health_episodes={k: len(m.episodes) for k, m in result.monitors.items()},
    )


class _Catch:
    """The levels of the records the bars' orders meet, caught during :func:`load_bars`' one pass.

    :func:`agent.execution.fills.order_schedule` says which record an order meets: the
    instrument's last record with ``ts_recv <= t + latency`` (running maximum), ``t`` the
    moment the bar is decided (:func:`feeds.bars.decision_times` of its closer: a time bar's
    instrument's first record after the bar's ``close_index``, an event bar's record at it).
    After each chunk the same rule runs, for the bars closed and not settled yet, on the
    instrument's records since the oldest of them (their stream index and running maximum
    ``ts_recv``; older ones can no longer be met, one is kept for the clamp below). A bar is
    settled once its closer and a record past its due time have arrived: its record can no
    longer change, and it is the instrument's record just before that later one, which came in
    this chunk; so it is in this chunk, or it is the instrument's last record before it, whose
    levels are kept. The bars still open at the end are settled on the instrument's last
    record, as the schedule clamps them. Whether an order is late is the schedule's own rule
    (:func:`agent.execution.fills.late_orders`). Tests hold the records caught and the lateness
    to the schedule's over whole files (``tests/backtest/test_fast_books.py``); :meth:`finish`
    checks that every bar was settled and caught."""

    def __init__(
        self, specs: Sequence[InstrumentSpec], latency_ms: float, bars: BarConfig, grace_ns: int
    ) -> None:
        self._latency_ns = round(latency_ms * 1_000_000)
        self._bars = bars
        self._grace_ns = grace_ns
        self._ids = [s.instrument_id for s in specs]
        self._index = dict.fromkeys(self._ids, _NONE)
        self._clock = dict.fromkeys(self._ids, _NONE)
        """Per instrument: its recent records' stream index and running maximum ``ts_recv``."""
        self._open = dict.fromkeys(self._ids, _NO_CLOSES)
        """Per instrument: its bars not settled yet."""
        self._closed = dict.fromkeys(self._ids, -1)
        """Per instrument: the close index of its last bar (later bars close at or after it)."""
        self._last: dict[int, tuple[int, np.ndarray[Any, Any]]] = {}
        """Per instrument: its last record so far (stream index, levels ``[1, LEVELS]``)."""
        self._rows: dict[int, list[np.ndarray[Any, Any]]] = {i: [] for i in self._ids}
        self._decided: dict[int, list[np.ndarray[Any, Any]]] = {i: [] for i in self._ids}
        """Per instrument and settled bar: when it is decided."""
        self._levels: dict[int, list[np.ndarray[Any, Any]]] = {i: [] for i in self._ids}

    def push(self, chunk: np.ndarray[Any, Any], offset: int, closes: dict[int, Closes]) -> None:
        """The next chunk (at ``offset`` in the stream) and the bars it closed, per instrument id
        (:meth:`feeds.features.FeatureStream.push`)."""
        ids, ts = np.ascontiguousarray(chunk["instrument_id"]), chunk["ts_recv"]  # one strided read
        for iid in self._ids:
            mine = np.flatnonzero(ids == iid)
            if mine.size:
                t = ts[mine].astype(np.int64)
                if self._clock[iid].size:
                    t[0] = max(int(t[0]), int(self._clock[iid][-1]))
                np.maximum.accumulate(t, out=t)
                self._index[iid] = np.concatenate([self._index[iid], mine + offset])
                self._clock[iid] = np.concatenate([self._clock[iid], t])
            new, pending = closes[iid], self._open[iid]
            if new.close_index.size:
                self._closed[iid] = int(new.close_index[-1])
                pending = Closes(*(np.concatenate(pair) for pair in zip(pending, new, strict=True)))
            settled = self._settle(iid, pending, (chunk, offset))
            self._open[iid] = Closes(pending.close_index[settled:], pending.close_ts[settled:])
            if mine.size:
                self._last[iid] = (offset + int(mine[-1]), levels_at(chunk, mine[-1:]))
            oldest = (
                int(self._open[iid].close_index[0]) if self._open[iid].close_index.size else self._closed[iid]
            )
            if oldest >= 0:  # keep the records after it, and the one at or before it (the clamp)
                keep = max(int(np.searchsorted(self._index[iid], oldest, side="right")) - 1, 0)
                self._index[iid] = self._index[iid][keep:]
                self._clock[iid] = self._clock[iid][keep:]

    def _settle(self, iid: int, closes: Closes, chunk: tuple[np.ndarray[Any, Any], int] | None) -> int:
        """Settle the leading ``closes`` that can be, with ``chunk`` (records, offset) the last
        one pushed; every one at the end (``chunk`` None). Returns how many."""
        index, clock = self._index[iid], self._clock[iid]
        n = index.shape[0]
        if not closes.close_index.size or not n:
            return 0
        after = closers(index, closes.close_index, self._bars)  # n: not arrived yet
        closer = clock[np.minimum(after, n - 1)]
        decided = decision_times(closer, closes.close_ts, self._bars, self._grace_ns)
        met = np.searchsorted(clock, decided + self._latency_ns, side="right")
        # settled: the closer arrived and a record past the due time too (a prefix of the closes:
        # both times grow with the bars)
        settled = int(
            closes.close_index.shape[0] if chunk is None else np.count_nonzero((after < n) & (met < n))
        )
        rows = index[met[:settled] - 1]
        self._decided[iid].append(decided[:settled])
        if chunk is not None and settled and rows[0] >= chunk[1]:  # most often: all in this chunk
            records, start = chunk
            self._rows[iid].append(rows)
            self._levels[iid].append(levels_at(records, rows - start))
            return settled
        levels = np.empty((settled, LEVELS), LEVEL_DTYPE)
        last, last_levels = self._last.get(iid, (-1, levels[:0]))
        caught = rows == last
        levels[caught] = last_levels
        if chunk is not None:
            records, start = chunk
            inside = rows >= start
            _words(levels)[inside] = _words(levels_at(records, rows[inside] - start))
            caught |= inside
        self._rows[iid].append(np.where(caught, rows, -1))
        self._levels[iid].append(levels)
        return settled

    def finish(self, n_bars: Sequence[int]) -> list[MetBooks]:
        """Per instrument (in ``specs`` order, ``n_bars`` its bars), the books its bars' orders
        meet and whether each order is late, once the last chunk is pushed (the bars still open
        are settled first); called once. The levels are views of one array, end to end in
        ``specs`` order, which :func:`_columns` then takes as it is (a copy of every bar's book
        cost up to ~0.1 s of page faults on 1M records)."""
        decided = []
        for iid, bars in zip(self._ids, n_bars, strict=True):
            self._settle(iid, self._open[iid], None)
            self._open[iid] = _NO_CLOSES
            rows = np.concatenate([_NONE, *self._rows.pop(iid)])
            if rows.shape[0] != bars or (rows < 0).any():  # see the class docstring: cannot happen
                raise BacktestError(f"the books of instrument {iid}'s orders were not all caught")
            decided.append(np.concatenate([_NONE, *self._decided.pop(iid)]))
        parts = [self._levels.pop(iid) for iid in self._ids]
        every = np.empty((sum(p.shape[0] for part in parts for p in part), LEVELS), LEVEL_DTYPE)
        out, at = [], 0
        for part, times in zip(parts, decided, strict=True):
            start = at
            for p in part:
                _words(every[at : at + p.shape[0]])[:] = _words(p)
                at += p.shape[0]
            out.append(MetBooks(every[start:at], late_orders(times, self._latency_ns), times))
        return out


_NONE = np.zeros(0, np.int64)
_NONE.flags.writeable = False
_NO_CLOSES = Closes(_NONE, _NONE)


def _words(levels: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Contiguous levels ``[n, LEVELS]`` as int64 words ``[n, 4 * LEVELS]`` (a view): NumPy moves
    a structured array field by field, several times slower than plain words."""
    return levels.view(np.int64)


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
    clock_close_bars: int
    """Bars closed on the clock (:func:`feeds.bars.clock_closes`)."""
    late_orders: int
    """Orders that execute after their instrument's next decision
    (:func:`agent.execution.fills.order_schedule`): the event-driven driver decides that bar
    before the fill, this driver after it. With one
    span per instrument and none late (and no risk limit acting), both drivers agree exactly."""


class _Grid(NamedTuple):
    """The lockstep grid: per step (row) and slot (column), the bar the slot reads and what of
    it does not depend on the decisions, gathered once for the whole run (``[steps, slots]``).
    A slot's span ends before the last step where ``active`` is false (its entries there are
    placeholders, never read)."""

    active: np.ndarray[Any, Any]
    bar: np.ndarray[Any, Any]
    """The bar's index in its instrument's bar sequence."""
    row: np.ndarray[Any, Any]
    """The bar's row in the instruments' bars concatenated (:class:`_Columns`)."""
    live: np.ndarray[Any, Any]
    """The bar is traded (not one of the ``K - 1`` bars a later span re-reads)."""
    closing: np.ndarray[Any, Any]
    """The last bar of a span before the instrument's last one: it ends flat."""
    may_trade: np.ndarray[Any, Any]
    """Live, tradable and orderable (:attr:`_Columns.orderable`)."""
    regime: np.ndarray[Any, Any]
    tradable: np.ndarray[Any, Any]
    mid_ticks: np.ndarray[Any, Any]


class _Columns(NamedTuple):
    """The instruments' bars concatenated (``offsets[i] + bar`` indexes them), with each bar's
    execution record and whether its order would be late (:func:`agent.execution.fills.order_schedule`)."""

    offsets: np.ndarray[Any, Any]
    features: np.ndarray[Any, Any]
    tradable: np.ndarray[Any, Any]
    mid_ticks: np.ndarray[Any, Any]
    ts_close: np.ndarray[Any, Any]
    exec_levels: np.ndarray[Any, Any]
    """Per bar, the levels of the book its order meets
    (:func:`agent.execution.fills.order_schedule`) as int64 words (:func:`_words`)."""
    late: np.ndarray[Any, Any]
    orderable: np.ndarray[Any, Any]
    """Bars decided together (a record closing empty bars within the grace): only the last may
    trade, as in the daemon. An empty bar (no record) decided at the same moment as the bar
    before was closed by the same record."""


def _joined(parts: Sequence[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """``parts`` (rows of one dtype and shape) concatenated: a slice of the array they are
    views of where they lie end to end in it (:meth:`_Catch.levels`' books), else a new array."""
    base = parts[0].base
    if isinstance(base, np.ndarray) and base.flags.c_contiguous and base.shape[1:] == parts[0].shape[1:]:
        origin, row = base.__array_interface__["data"][0], base.strides[0]
        start = at = parts[0].__array_interface__["data"][0] - origin
        for p in parts:
            if p.base is not base or p.__array_interface__["data"][0] - origin != at:
                break
            at += p.shape[0] * row
        else:
            if base.dtype == parts[0].dtype and start % row == 0:
                return base[start // row : at // row]
    return np.concatenate(parts)


def _columns(bars: BarSet, specs: Sequence[InstrumentSpec], frames: Sequence[BarFrame]) -> _Columns:
    books = [bars.books[s.symbol] for s in specs]  # an instrument may stand in several slots
    return _Columns(
        offsets=np.concatenate([[0], np.cumsum([len(f) for f in frames])]).astype(np.int64),
        features=np.concatenate([f.features for f in frames]),
        tradable=np.concatenate([f.tradable for f in frames]),
        mid_ticks=np.concatenate([f.mid_ticks for f in frames]).astype(np.float64),
        ts_close=np.concatenate([f.ts_close for f in frames]),
        exec_levels=_words(_joined([b.levels for b in books])),
        late=np.concatenate([b.late for b in books]),
        orderable=np.concatenate(
            [
                np.r_[(f.n_records[1:] > 0) | (b.decided_ns[1:] != b.decided_ns[:-1]), True]
                for f, b in zip(frames, books, strict=True)
            ]
        ),
    )


def _grid(
    cols: _Columns,
    regime: np.ndarray[Any, Any],
    *,
    inst: np.ndarray[Any, Any],
    lo: np.ndarray[Any, Any],
    start: np.ndarray[Any, Any],
    hi: np.ndarray[Any, Any],
    n_bars: np.ndarray[Any, Any],
) -> _Grid:
    """The :class:`_Grid` of slots of instrument ``inst`` reading bars ``[lo, hi)`` from step 0,
    trading from ``start``."""
    bar = lo + np.arange(int((hi - lo).max()))[:, None]
    active = bar < hi
    row = np.where(active, cols.offsets[inst] + bar, 0)
    live = bar >= start
    tradable = cols.tradable[row]
    return _Grid(
        active=active,
        bar=bar,
        row=row,
        live=live,
        closing=(bar == hi - 1) & (hi < n_bars[inst]),
        may_trade=live & tradable & cols.orderable[row],
        regime=regime[row],
        tradable=tradable,
        mid_ticks=cols.mid_ticks[row],
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

    What does not depend on the decisions (the bars each step reads, their regime scale, whether
    they may trade, the decision log's columns) is laid out once for all steps (:class:`_Grid`);
    a step only builds its observation rows, decides, and fills its orders.
    """
    if chunks < 1:
        raise BacktestError(f"chunks must be >= 1, got {chunks}")
    if config.broker.latency_ms != bars.latency_ms:
        raise BacktestError(
            f"the bars' books were met at {bars.latency_ms} ms of latency, broker.latency_ms is "
            f"{config.broker.latency_ms}"
        )
    if config.daemon.close_grace_ns != bars.close_grace_ns:
        raise BacktestError(
            f"the bars were decided with a close grace of {bars.close_grace_ns / 1e6} ms, "
            f"daemon.close_grace_ms is {config.daemon.close_grace_ms}"
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
    grid = _grid(cols, np.concatenate(list(regimes)), inst=inst, lo=lo, start=start, hi=hi, n_bars=n_bars)
    tick_px = np.asarray([float(tick_fixed(s.tick_size)) for s in specs])[inst]
    fee = config.broker.fee_per_contract
    risk = RiskLimits(config.risk)
    reward_scale = config.train.reward_scale

    n_slots = slot_id.shape[0]
    held = PositionArrays.flat(n_slots)
    decisions: list[Decided] = []
    positions: list[np.ndarray[Any, Any]] = []
    ordered: list[np.ndarray[Any, Any]] = []
    fill_parts: list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
    steps = grid.bar.shape[0]
    everyone = np.arange(n_slots)
    spent = 0.0
    for step in range(steps):
        # every slot (most steps): views of the grid's rows, not copies
        active: slice | np.ndarray[Any, Any] = (
            slice(None) if grid.active[step].all() else np.flatnonzero(grid.active[step])
        )
        g = grid.row[step, active]
        pos = held.position[active].astype(np.int64)
        rows = observation_rows(
            cols.features[g],
            positions=pos,
            entry_px=held.avg_price[active],
            mid_ticks=grid.mid_ticks[step, active],
            tick_px=tick_px[active],
            reward_scale=reward_scale,
        )
        t0 = time.perf_counter()
        decided = decider.decide(
            slot_id[active], rows, pos, grid.regime[step, active], grid.tradable[step, active]
        )
        spent += time.perf_counter() - t0
        closing = grid.closing[step, active]  # a span before the last one ends flat
        target = np.where(closing, 0, risk.clamp_targets(decided.target))
        trade = grid.may_trade[step, active] & (decided.valid | closing) & (target != pos)
        decisions.append(decided)  # the caller's arrays (the Decider contract): kept as they are
        positions.append(pos)
        ordered.append(trade)
        if trade.any():
            took = np.flatnonzero(trade)
            who = everyone[active][took]
            held, done, filled, price = _execute(
                levels=cols.exec_levels[g[took]].view(LEVEL_DTYPE),
                qty=(target - pos)[took].astype(np.float64),
                slots=who,
                held=held,
                fill_price=config.broker.fill_price,
            )
            fill_parts.append((step, who[done], filled[done], price[done]))
        if on_step is not None:
            on_step(step + 1, steps)
    sent = np.concatenate(ordered)
    return FastRun(
        _decision_log(grid, inst, cols, decisions=decisions, positions=positions, ordered=sent),
        _fill_list(fill_parts, inst, lo, cols, fee),
        spent / max(sent.shape[0], 1),
        sum(_clock_close_bars(bars, symbol, config) for symbol in dict.fromkeys(s.symbol for s in specs)),
        int(cols.late[grid.row[grid.active][sent]].sum()),
    )


def _clock_close_bars(bars: BarSet, symbol: str, config: Config) -> int:
    """How many of ``symbol``'s bars a live daemon closes on the clock."""
    decided, close_ts = bars.books[symbol].decided_ns, bars.frames[symbol].ts_close
    on_clock = clock_closes(decided, close_ts, config.feeds.bars, config.daemon.close_grace_ns)
    return int(np.count_nonzero(on_clock))


def _decision_log(
    grid: _Grid,
    inst: np.ndarray[Any, Any],
    cols: _Columns,
    *,
    decisions: Sequence[Decided],
    positions: Sequence[np.ndarray[Any, Any]],
    ordered: np.ndarray[Any, Any],
) -> DecisionLog:
    """The log of the live rows of the steps' ``decisions`` (taken at ``positions``, ``ordered``
    concatenated), in the order decided: the grid's active cells in row-major order."""
    live = grid.live[grid.active]
    log = DecisionLog()
    log.add(
        ts_ns=cols.ts_close[grid.row[grid.active]][live],
        instrument=inst[np.nonzero(grid.active)[1]][live],
        bar=grid.bar[grid.active][live],
        decided=Decided.concat(decisions).take(live),
        regime=grid.regime[grid.active][live],
        position=np.concatenate(positions)[live],
        ordered=ordered[live],
    )
    return log


def _fill_list(
    parts: Sequence[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]],
    inst: np.ndarray[Any, Any],
    lo: np.ndarray[Any, Any],
    cols: _Columns,
    fee: float,
) -> FillList:
    """The fills of ``parts`` (step, slots, filled, price), in the order made."""
    fills = FillList.empty()
    if not parts:
        return fills
    slot = np.concatenate([p[1] for p in parts])
    bar = lo[slot] + np.repeat([p[0] for p in parts], [p[1].shape[0] for p in parts])
    qty = np.concatenate([p[2] for p in parts])
    fills.instrument.extend(inst[slot].tolist())
    fills.bar.extend(bar.tolist())
    fills.ts_ns.extend(cols.ts_close[cols.offsets[inst[slot]] + bar].tolist())
    fills.qty.extend(qty.tolist())
    fills.price.extend(np.concatenate([p[3] for p in parts]).tolist())
    fills.fee.extend(np.asarray(fees(qty, fee), dtype=np.float64).tolist())
    return fills


def _execute(
    *,
    levels: np.ndarray[Any, Any],
    qty: np.ndarray[Any, Any],
    slots: np.ndarray[Any, Any],
    held: PositionArrays,
    fill_price: FillPrice,
) -> tuple[PositionArrays, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Market orders of signed size ``qty`` against the books ``levels``
    (:data:`feeds.book.LEVEL_DTYPE`, ``[orders, LEVELS]``): the paper broker's book walk (IOC
    remainder dropped), priced by its fill rule and rounded to a fixed-point unit. Books the
    fills in ``held`` (one entry per slot, ``slots`` the orders'); returns the new positions
    and, per order, whether it filled, the contracts filled and the price."""
    fill = walk_book(levels["bid_px"], levels["bid_sz"], levels["ask_px"], levels["ask_sz"], qty)
    exec_px = execution_price(fill, levels["bid_px"][:, 0], levels["ask_px"][:, 0], fill_price)
    done = np.isfinite(exec_px)
    filled = np.where(done, np.asarray(fill.filled, dtype=np.float64), 0.0)
    price = np.rint(np.where(done, exec_px, 0.0))
    qty_all = np.zeros(held.position.shape[0])
    px_all = np.zeros(held.position.shape[0])
    qty_all[slots] = filled
    px_all[slots] = price
    return apply_fills(held, qty_all, px_all), done, filled, price
