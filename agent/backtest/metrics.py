"""Out-of-sample performance of a position path (ALGORITHMS section 5): the figures of a backtest
and of the trainer's folds and gate.

Inputs are per-bar records, one row per (instrument, bar), in any order: net P&L after costs in
account currency, the cost part of it, contracts traded at the bar, the absolute position held
over the bar, and the bar's close time (ns since the epoch, UTC).

Annualisation follows the real sampling cadence: P&L is summed into buckets of ``bucket_s``
seconds of the clock, and with ``D`` distinct trading days in the sample and ``B`` non-empty
buckets, ``periods_per_year = 252 * B / D``; then
``sharpe = mean(r) / std(r, ddof=1) * sqrt(periods_per_year)``. Daily buckets give the textbook
``sqrt(252)``; intraday buckets (short test windows) scale by the number of buckets a trading
day really holds, so an event clock or a shortened session annualises correctly too.
Square-root scaling assumes uncorrelated bucket returns.

``bucket_s = 0`` chooses the bucket from the sample's timestamps alone (so a candidate, the
incumbent and the baselines on the same bars get the same one): calendar days (UTC) when the
sample spans at least :data:`MIN_BUCKETS` days, else the longest of :data:`INTRADAY_BUCKETS_S`
that gives at least :data:`MIN_BUCKETS` non-empty buckets (the shortest if none does). A walk-
forward test block of a few hours then gets a Sharpe from dozens of returns, not an undefined
one from a single day.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

__all__ = ["NS_PER_DAY", "Performance", "bucket_sums", "choose_bucket_s", "performance"]

NS_PER_DAY = 86_400_000_000_000
TRADING_DAYS_PER_YEAR = 252
MIN_BUCKETS = 20
"""Returns an automatically chosen bucket must give at least (when the sample allows)."""
INTRADAY_BUCKETS_S = (14_400.0, 3_600.0, 1_800.0, 900.0, 300.0, 60.0, 10.0, 1.0)


class Performance(msgspec.Struct, frozen=True, kw_only=True):
    """Metrics of one P&L record (currency figures are for the positions as given)."""

    sharpe: float
    """Annualised Sharpe ratio of bucketed net P&L (0 when undefined: < 2 buckets or no variance)."""
    sortino: float
    """Annualised mean over downside deviation ``sqrt(mean(min(r, 0)^2))`` (0 when undefined)."""
    max_drawdown: float
    """Largest peak-to-trough fall of cumulative net P&L (currency, >= 0)."""
    pnl: float
    """Net P&L after costs (currency)."""
    costs: float
    """Half-spreads and fees paid (currency)."""
    turnover: float
    """Contracts traded per trading day."""
    hit_rate: float
    """Share of bars holding a position whose net P&L is positive (0 when never in a position)."""
    n_bars: int
    n_days: int
    bucket_s: float
    """The P&L bucket the Sharpe and Sortino were computed on (seconds; 86,400 = daily)."""
    periods_per_year: float


def bucket_sums(values: Any, ts_ns: Any, bucket_ns: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Sums of ``values`` per clock bucket ``floor(ts / bucket_ns)``, in bucket order (empty
    buckets are absent)."""
    keys = np.asarray(ts_ns, dtype=np.int64) // bucket_ns
    _, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=np.asarray(values, dtype=np.float64))
    return sums.astype(np.float64)


def choose_bucket_s(ts_ns: Any) -> float:
    """The bucket (seconds) ``bucket_s = 0`` stands for, from the timestamps alone (see the
    module docstring)."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    if ts.size == 0 or np.unique(ts // NS_PER_DAY).size >= MIN_BUCKETS:
        return NS_PER_DAY / 1e9
    for bucket_s in INTRADAY_BUCKETS_S:
        if np.unique(ts // round(bucket_s * 1e9)).size >= MIN_BUCKETS:
            return bucket_s
    return INTRADAY_BUCKETS_S[-1]


def _annualised(mean: float, dev: float, periods_per_year: float) -> float:
    if not (math.isfinite(mean) and math.isfinite(dev)) or dev <= 1e-12 * max(1.0, abs(mean)):
        return 0.0
    return mean / dev * math.sqrt(periods_per_year)


def performance(
    pnl: Any, costs: Any, traded: Any, held: Any, ts_ns: Any, *, bucket_s: float = 0.0
) -> Performance:
    """Metrics of per-bar records (see the module docstring for units and annualisation)."""
    pnl = np.asarray(pnl, dtype=np.float64)
    ts = np.asarray(ts_ns, dtype=np.int64)
    if pnl.size == 0:
        return Performance(
            sharpe=0.0,
            sortino=0.0,
            max_drawdown=0.0,
            pnl=0.0,
            costs=0.0,
            turnover=0.0,
            hit_rate=0.0,
            n_bars=0,
            n_days=0,
            bucket_s=NS_PER_DAY / 1e9,
            periods_per_year=float(TRADING_DAYS_PER_YEAR),
        )
    order = np.argsort(ts, kind="stable")
    bucket_s = bucket_s if bucket_s > 0 else choose_bucket_s(ts)
    bucket_ns = max(1, round(bucket_s * 1e9))
    buckets = bucket_sums(pnl, ts, bucket_ns)
    n_days = int(np.unique(ts // NS_PER_DAY).size)
    periods = TRADING_DAYS_PER_YEAR * buckets.size / n_days
    if buckets.size >= 2:
        mean = float(buckets.mean())
        sharpe = _annualised(mean, float(buckets.std(ddof=1)), periods)
        sortino = _annualised(mean, float(np.sqrt(np.mean(np.minimum(buckets, 0.0) ** 2))), periods)
    else:
        sharpe = sortino = 0.0
    equity = np.cumsum(pnl[order])
    drawdown = float(np.max(np.maximum.accumulate(np.maximum(equity, 0.0)) - equity))
    held_arr = np.asarray(held) != 0
    n_held = int(held_arr.sum())
    hit = float((pnl[held_arr] > 0).sum() / n_held) if n_held else 0.0
    return Performance(
        sharpe=sharpe,
        sortino=sortino,
        max_drawdown=max(drawdown, 0.0),
        pnl=float(pnl.sum()),
        costs=float(np.asarray(costs, dtype=np.float64).sum()),
        turnover=float(np.abs(np.asarray(traded, dtype=np.float64)).sum() / n_days),
        hit_rate=hit,
        n_bars=int(pnl.size),
        n_days=n_days,
        bucket_s=bucket_s,
        periods_per_year=float(periods),
    )
