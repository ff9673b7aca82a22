"""The backtest's entry point, ``run_backtest``: resolve the inputs, run a driver and the
baselines, and book the results (what ``tradeagent backtest``, the demo and the trainer's fold
evaluation call).

Both modes report from the same books (:func:`agent.backtest.books.bar_pnl` over the fills,
marked at the bar-close mids) and the metrics the trainer's gate uses too
(:func:`agent.backtest.metrics.performance`: Sharpe annualised for the real bar cadence, Sortino,
drawdown, turnover, hit rate, costs). The
baselines (flat, random, always long) run side by side through the vectorised driver on the same
bars with the same costs, one span per instrument over the whole window: always long enters once and holds, as
the daemon would hold it (a span per chunk would close and reopen it at every chunk edge and
charge the baseline a round trip each time). Nothing is written here:
:func:`agent.reports.backtest.write_backtest` writes the files.

The vectorised driver does not simulate the order-rate limit or the loss and drawdown halt
(:mod:`agent.backtest.fast`): a ``--fast`` run is replayed through them afterwards and refused
(:class:`BacktestError`) when one would have acted, and refused up front with limit orders; its
summary says so (``risk_limits``). An ``exact`` request (the trainer's gate) runs the vectorised
driver with one span per instrument and keeps its result only where it equals the event-driven
one (those checks pass and no order executes after its instrument's next decision); otherwise
it replays the window event by event. The baselines are yardsticks of the market over the window,
not policies the daemon runs: market orders, the position clamp, no halts.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from agent.backtest.books import BarPnl, DecisionLog, bar_pnl
from agent.backtest.errors import BacktestError
from agent.backtest.event import EventDriver
from agent.backtest.fast import BarSet, FillList, load_bars, marks_of, regime_path, run_fast
from agent.backtest.inputs import (
    ResolvedCheckpoint,
    check_compatible,
    ns_iso,
    resolve_checkpoint,
    select_days,
)
from agent.backtest.metrics import NS_PER_DAY, Performance, performance
from agent.backtest.runs import run_decider, scratch_ledger
from agent.config import Config
from agent.model.checkpoint import Checkpoint
from agent.policy.regime import RegimeTracker
from agent.progress import Progress
from agent.trading.config import RiskConfig
from agent.trading.decider import BASELINES, BaselineDecider
from agent.trading.risk import first_binding
from feeds.config import FeedsConfig, InstrumentSpec
from feeds.dbn import dbn_files, read_metadata
from feeds.errors import UnknownInstrument
from feeds.features import BarFrame

__all__ = ["BacktestRequest", "BacktestResult", "BacktestSummary", "Books", "run_backtest", "run_baselines"]

FAST_CHUNKS = 64
"""Spans per instrument stepped in lockstep by the vectorised driver (``--chunks``)."""


@dataclass(frozen=True)
class BacktestRequest:
    """What ``tradeagent backtest`` asks for."""

    data: Path
    checkpoint: str | ResolvedCheckpoint
    """``promoted``, a sha256 (prefix) in the configured store, a checkpoint file, or a checkpoint
    already resolved with its floors (the trainer's evaluation of a fold's model)."""
    start_ns: int | None = None
    """Window ``[start_ns, end_ns)`` in ns UTC (:func:`agent.backtest.inputs.parse_bound`);
    None = from the first day of the data / to its last."""
    end_ns: int | None = None
    fast: bool = False
    chunks: int = FAST_CHUNKS
    """Vectorised driver only: spans per instrument in lockstep (1 = exact event-driven parity)."""
    baselines: bool = True
    """Also trade the baselines on the same bars (the trainer runs them as a job of their own,
    :func:`run_baselines`); without them the summary's ``baselines`` is empty."""
    exact: bool = False
    """The event-driven run's result by the quickest exact route (the trainer's gate): the
    vectorised driver with one span per instrument when it gives the same decisions, fills and
    P&L (market orders, no risk limit acting, every order executed before its instrument's next
    decision), else the event-driven replay. ``fast`` and ``chunks`` are not read; the
    summary's ``mode`` says which driver ran."""


class BacktestSummary(msgspec.Struct, kw_only=True):
    """The JSON summary of a backtest (currency figures in the account currency)."""

    mode: str
    """``event`` (the daemon's pipeline) or ``fast`` (the vectorised driver)."""
    pnl: float
    """The model's P&L as traded (the daemon's selection, sizing, risk, fills and fees), after
    costs, in account currency: ``performance.pnl``."""
    checkpoint_sha256: str
    data: str
    start: str
    """The replayed window ``[start, end)``, ISO 8601 UTC."""
    end: str
    first_day: str
    last_day: str
    instruments: list[str]
    records: int
    bars: int
    decisions: int
    orders: int
    fills: int
    performance: Performance
    """After costs, over all instruments (P&L summed per bar)."""
    per_instrument: dict[str, Performance]
    per_day: dict[str, float]
    """Net P&L per UTC day."""
    baselines: dict[str, Performance]
    action_mix: dict[str, float]
    """Share of valid decisions per action (short, flat, long)."""
    latency_us: dict[str, float]
    """Decision latency: p50, p90, p99, max (microseconds; per decision row in ``fast`` mode,
    amortised over its batch)."""
    ledger_pnl: float | None
    """Event mode: P&L rebuilt from the SQL ledger's fills (equals ``performance.pnl``)."""
    risk_limits: str
    """``enforced`` (event mode: position clamp, order rate, daily loss and drawdown halt, on the
    feed clock, as the daemon) or ``not binding`` (fast mode: the position clamp applied; the
    order rate, daily loss and drawdown replayed on the run's path and found not to act, else
    the run is refused)."""
    health: dict[str, int]
    halt_reason: str
    halt_at: str
    """Event mode: when the risk halt latched (ISO 8601 UTC, the feed clock; "" if it did not)."""
    wall_s: float
    records_per_s: float


@dataclass(frozen=True)
class Books:
    """Per-bar books of one policy over every instrument, for metrics and plots."""

    ts_ns: np.ndarray[Any, Any]
    instrument: np.ndarray[Any, Any]
    pnl: np.ndarray[Any, Any]
    cost: np.ndarray[Any, Any]
    traded: np.ndarray[Any, Any]
    held: np.ndarray[Any, Any]
    position: np.ndarray[Any, Any]

    def performance(self, bucket_s: float, mask: np.ndarray[Any, Any] | None = None) -> Performance:
        m = slice(None) if mask is None else mask
        return performance(
            self.pnl[m], self.cost[m], self.traded[m], self.held[m], self.ts_ns[m], bucket_s=bucket_s
        )

    def equity(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(close time, cumulative P&L) over all instruments in time order."""
        order = np.argsort(self.ts_ns, kind="stable")
        return self.ts_ns[order], np.cumsum(self.pnl[order])


@dataclass(frozen=True)
class BacktestResult:
    summary: BacktestSummary
    books: Books
    baselines: dict[str, Books]
    decisions: dict[str, np.ndarray[Any, Any]]
    latency_ns: np.ndarray[Any, Any]
    symbols: tuple[str, ...]


def _specs(feeds: FeedsConfig, data: Path) -> list[InstrumentSpec]:
    present: set[str] = set()
    for file in dbn_files(data):
        present.update(read_metadata(file).symbols.values())
    specs = [s for s in feeds.instruments if s.symbol in present or not present]
    if not specs:
        raise UnknownInstrument(
            f"{data}: its symbols ({', '.join(sorted(present))}) are not among the configured instruments "
            f"({', '.join(s.symbol for s in feeds.instruments)})"
        )
    return specs


def _books(
    specs: list[InstrumentSpec], frames: list[BarFrame], fills: dict[str, np.ndarray[Any, Any]]
) -> Books:
    """The per-bar books of ``fills`` (:meth:`FillList.arrays`) over each instrument's bars."""
    cols: dict[str, list[np.ndarray[Any, Any]]] = {k: [] for k in Books.__dataclass_fields__}
    for i, (spec, frame) in enumerate(zip(specs, frames, strict=True)):
        mine = fills["instrument"] == i
        marks = marks_of(frame)
        books: BarPnl = bar_pnl(
            spec,
            np.nan_to_num(marks),
            fill_bar=fills["bar"][mine],
            fill_qty=fills["qty"][mine],
            fill_px=fills["price"][mine],
            fill_fee=fills["fee"][mine],
        )
        cols["ts_ns"].append(frame.ts_close.astype(np.int64))
        cols["instrument"].append(np.full(len(frame), i, dtype=np.int64))
        for name in ("pnl", "cost", "traded", "held", "position"):
            cols[name].append(getattr(books, name))
    return Books(**{k: np.concatenate(v) for k, v in cols.items()})


def _baselines(bars: BarSet, specs: list[InstrumentSpec], config: Config) -> dict[str, Books]:
    """The baselines over the whole window, one span per instrument (see the module docstring),
    stepped side by side in one run: baseline ``b`` trades instrument ``i`` in slot
    ``b * len(specs) + i``."""
    n = len(specs)
    decider = BaselineDecider(BASELINES, n, config.policy.max_contracts, config.seed)
    stacked = [s for _ in BASELINES for s in specs]
    frames = [bars.frames[s.symbol] for s in specs]
    ones = [np.ones(len(f)) for _ in BASELINES for f in frames]  # the baselines do not read the regime
    f = run_fast(bars, stacked, config, decider, ones, chunks=1).fills.arrays()
    out: dict[str, Books] = {}
    for b, name in enumerate(BASELINES):
        mine = f["instrument"] // n == b
        own = {k: v[mine] for k, v in f.items()}
        own["instrument"] = own["instrument"] - b * n
        out[name] = _books(specs, frames, own)
    return out


def run_baselines(config: Config, data: Path, start_ns: int | None, end_ns: int | None) -> dict[str, Books]:
    """The baselines' books over a window, exactly as :func:`run_backtest` trades them beside a
    model on the same window (the trainer's evaluation runs them as a job of their own)."""
    selection = select_days(data, start_ns, end_ns)
    specs = _specs(config.feeds, data)
    bars = load_bars(
        data,
        specs,
        config.feeds,
        start_ns=selection.start_ns,
        end_ns=selection.end_ns,
        latency_ms=config.broker.latency_ms,
        close_grace_ns=config.daemon.close_grace_ns,
    )
    return _baselines(bars, specs, config)


def _binding(
    risk: RiskConfig,
    decisions: dict[str, np.ndarray[Any, Any]],
    books: Books,
    decided_ns: np.ndarray[Any, Any],
) -> str | None:
    """Why a vectorised run cannot stand, if a limit it does not simulate would have acted: its
    orders and its equity after each decision (the books' P&L to the bar, the bar's own fill not
    yet booked, as the daemon sees it when it checks) through :func:`first_binding`, at the
    moments the bars are decided and their orders placed (``decided_ns``, per row of ``books``:
    :attr:`agent.backtest.fast.MetBooks.decided_ns`), as the event-driven driver checks them."""
    order = np.argsort(decided_ns, kind="stable")
    equity = np.cumsum(books.pnl[order]) + books.cost[order]
    ordered = decisions["ordered"].astype(bool)
    offsets = np.searchsorted(books.instrument, np.arange(int(books.instrument.max()) + 1))
    row = offsets[decisions["instrument"]] + decisions["bar"]
    binding = first_binding(
        risk,
        order_ns=decided_ns[row[ordered]].astype(np.int64),
        check_ns=decided_ns[order],
        equity=equity,
    )
    if binding is None:
        return None
    at, reason = binding
    return (
        f"the risk limits would have acted at {ns_iso(at)} ({reason}); the vectorised driver "
        "does not simulate the order-rate limit or the loss and drawdown halt: run the "
        "event-driven backtest (without --fast), or loosen [risk]"
    )


def _latency(values_ns: np.ndarray[Any, Any]) -> dict[str, float]:
    if values_ns.size == 0:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    us = values_ns / 1e3
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(us.max())}


@dataclass(frozen=True)
class _Driven:
    """What a driver produced: its decisions, fills and each instrument's bars, the counts the
    summary reports and the decision latencies; the event driver's ledger P&L and risk halt."""

    mode: str
    log: DecisionLog
    fills: FillList
    frames: list[BarFrame]
    counts: dict[str, int]
    latency_ns: np.ndarray[Any, Any]
    ledger_pnl: float | None = None
    halt_reason: str = ""
    halt_at: str = ""


def run_backtest(config: Config, request: BacktestRequest, progress: Progress) -> BacktestResult:
    """Run the backtest described by ``request``; raise :class:`BacktestError` (or the feeds /
    storage errors) for bad input before any work is done."""
    wall0 = time.perf_counter()
    selection = select_days(request.data, request.start_ns, request.end_ns)
    resolved = (
        request.checkpoint
        if isinstance(request.checkpoint, ResolvedCheckpoint)
        else resolve_checkpoint(request.checkpoint, config.feeds, config.storage, config.data_dir)
    )
    checkpoint = resolved.checkpoint
    check_compatible(checkpoint)
    if request.fast and not request.exact and config.broker.order_type == "limit":
        raise BacktestError(
            'broker.order_type = "limit": the vectorised driver sends market orders only (resting '
            "limit orders need the book's queue, record by record); run without --fast"
        )
    specs = _specs(config.feeds, request.data)
    floors = [resolved.floors.get(s.instrument_id, 0.0) for s in specs]
    progress.start("bars", 1)
    bars = load_bars(
        request.data,
        specs,
        config.feeds,
        start_ns=selection.start_ns,
        end_ns=selection.end_ns,
        latency_ms=config.broker.latency_ms,
        close_grace_ns=config.daemon.close_grace_ns,
    )
    progress.advance("bars")
    n_records = bars.n_records
    driven: _Driven | None = None
    if config.broker.order_type == "market" if request.exact else request.fast:
        frames = [bars.frames[s.symbol] for s in specs]
        regimes = regime_path(frames, RegimeTracker(config.regime, config.policy.scale_floor, floors))
        chunks = 1 if request.exact else max(1, request.chunks)
        driven = _fast(
            config, specs, chunks, checkpoint=checkpoint, bars=bars, regimes=regimes, progress=progress
        )
        books = _books(specs, driven.frames, driven.fills.arrays())
        decisions = driven.log.arrays()
        decided = np.concatenate([bars.books[s.symbol].decided_ns for s in specs])
        refusal = _binding(config.risk, decisions, books, decided)
        if refusal is not None and not request.exact:
            raise BacktestError(refusal)
        if refusal is not None or (request.exact and driven.counts["late_orders"]):
            driven = None  # not the event-driven result: replay event by event
    if driven is None:
        driven = _event(
            config,
            request,
            specs,
            checkpoint=checkpoint,
            floors=floors,
            start_ns=selection.start_ns,
            end_ns=selection.end_ns,
            n_records=n_records,
            progress=progress,
        )
        books = _books(specs, driven.frames, driven.fills.arrays())
        decisions = driven.log.arrays()
    base: dict[str, Books] = {}
    if request.baselines:
        progress.start("baselines", 1)
        base = _baselines(bars, specs, config)
        progress.advance("baselines")
    bucket = config.train.sharpe_bucket_s
    valid = decisions["valid"].astype(bool) if decisions["valid"].size else np.zeros(0, bool)
    acts = decisions["action"][valid].astype(np.int64)
    mix = np.bincount(acts, minlength=3) / max(acts.size, 1)
    day_keys = books.ts_ns // NS_PER_DAY
    per_day = {
        str(dt.date(1970, 1, 1) + dt.timedelta(days=int(d))): float(books.pnl[day_keys == d].sum())
        for d in np.unique(day_keys)
    }
    wall = time.perf_counter() - wall0
    performance_all = books.performance(bucket)
    summary = BacktestSummary(
        mode=driven.mode,
        pnl=performance_all.pnl,
        checkpoint_sha256=checkpoint.sha256,
        data=str(request.data),
        start=ns_iso(selection.start_ns),
        end=ns_iso(selection.end_ns),
        first_day=str(selection.first_day),
        last_day=str(selection.last_day),
        instruments=[s.symbol for s in specs],
        records=n_records,
        bars=int(sum(len(f) for f in driven.frames)),
        decisions=int(valid.sum()),
        orders=int(driven.counts.get("orders", 0)),
        fills=len(driven.fills.bar),
        performance=performance_all,
        per_instrument={
            s.symbol: books.performance(bucket, books.instrument == i) for i, s in enumerate(specs)
        },
        per_day=per_day,
        baselines={k: v.performance(bucket) for k, v in base.items()},
        action_mix={"short": float(mix[0]), "flat": float(mix[1]), "long": float(mix[2])},
        latency_us=_latency(driven.latency_ns),
        ledger_pnl=driven.ledger_pnl,
        risk_limits="not binding" if driven.mode == "fast" else "enforced",
        health={
            "episodes": int(sum(bars.health_episodes.values())),
            "rejected_records": bars.rejected_records,
            "untradable_bars": int(sum(int((~f.tradable).sum()) for f in driven.frames)),
            **{k: v for k, v in driven.counts.items() if k not in ("orders", "fills")},
        },
        halt_reason=driven.halt_reason,
        halt_at=driven.halt_at,
        wall_s=wall,
        records_per_s=n_records / wall if wall > 0 else 0.0,
    )
    return BacktestResult(
        summary=summary,
        books=books,
        baselines=base,
        decisions=decisions,
        latency_ns=driven.latency_ns,
        symbols=tuple(s.symbol for s in specs),
    )


def _fast(
    config: Config,
    specs: list[InstrumentSpec],
    chunks: int,
    *,
    checkpoint: Checkpoint,
    bars: BarSet,
    regimes: list[Any],
    progress: Progress,
) -> _Driven:
    """The vectorised run, ``chunks`` spans per instrument in lockstep; its latency is the
    amortised one per decision row."""
    decider = run_decider(checkpoint, config, specs, chunks)
    progress.start("fast", 100)
    done = [0]

    def step(k: int, total: int) -> None:
        pct = k * 100 // total
        if pct > done[0]:
            progress.advance("fast", pct - done[0])
            done[0] = pct

    try:
        run = run_fast(bars, specs, config, decider, regimes, chunks=chunks, on_step=step)
    finally:
        decider.close()
    return _Driven(
        mode="fast",
        log=run.log,
        fills=run.fills,
        frames=[bars.frames[s.symbol] for s in specs],
        counts={
            "orders": int(run.log.arrays()["ordered"].astype(bool).sum()),
            "fills": len(run.fills.bar),
            "late_orders": run.late_orders,
            "clock_close_bars": run.clock_close_bars,
        },
        latency_ns=np.full(1, run.per_row_s * 1e9),
    )


def _event(
    config: Config,
    request: BacktestRequest,
    specs: list[InstrumentSpec],
    *,
    checkpoint: Checkpoint,
    floors: list[float],
    start_ns: int,
    end_ns: int,
    n_records: int,
    progress: Progress,
) -> _Driven:
    """The event-driven run with its throwaway SQLite ledger (deleted afterwards)."""
    decider = run_decider(checkpoint, config, specs)
    progress.start("replay", n_records)
    try:
        with scratch_ledger("tradeagent-backtest-") as database:
            driver = EventDriver(
                config, specs, decider, database, floors, on_records=lambda n: progress.advance("replay", n)
            )
            run = asyncio.run(driver.replay(request.data, start_ns, end_ns))
    finally:
        decider.close()
    frames = [
        BarFrame.concat(run.frames[s.symbol])
        if run.frames[s.symbol]
        else BarFrame.empty(s.instrument_id, s.symbol)
        for s in specs
    ]
    if not any(len(f) for f in frames):
        raise BacktestError(f"{request.data}: the replay closed no bar in the selected dates")
    return _Driven(
        mode="event",
        log=run.log,
        fills=run.fills,
        frames=frames,
        counts=run.counts,
        latency_ns=np.asarray(run.latency_ns, dtype=np.float64),
        ledger_pnl=run.ledger_pnl,
        halt_reason=run.halt_reason,
        halt_at=ns_iso(run.halt_ns) if run.halt_ns is not None else "",
    )
