"""Out-of-sample performance of a position path (ALGORITHMS section 5).

Inputs are per-bar records, one row per (instrument, bar), in any order: net P&L after costs in
account currency, the cost part of it, contracts traded at the bar, the absolute position held
over the bar, and the bar's close time (ns since the epoch, UTC).

Annualisation follows the real sampling cadence: P&L is summed into buckets of ``bucket_s``
seconds of the clock (``0`` = calendar days, UTC), and with ``D`` distinct trading days in the
sample and ``B`` non-empty buckets, ``periods_per_year = 252 * B / D``; then
``sharpe = mean(r) / std(r, ddof=1) * sqrt(periods_per_year)``. Daily buckets give the textbook
``sqrt(252)``; intraday buckets (short test windows) scale by the number of buckets a trading
day really holds, so an event clock or a shortened session annualises correctly too.
Square-root scaling assumes uncorrelated bucket returns.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

__all__ = ["NS_PER_DAY", "Performance", "bucket_sums", "performance"]

NS_PER_DAY = 86_400_000_000_000
TRADING_DAYS_PER_YEAR = 252


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
    periods_per_year: float


def bucket_sums(values: Any, ts_ns: Any, bucket_ns: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Sums of ``values`` per clock bucket ``floor(ts / bucket_ns)``, in bucket order (empty
    buckets are absent)."""
    keys = np.asarray(ts_ns, dtype=np.int64) // bucket_ns
    _, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=np.asarray(values, dtype=np.float64))
    return sums.astype(np.float64)


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
            periods_per_year=float(TRADING_DAYS_PER_YEAR),
        )
    order = np.argsort(ts, kind="stable")
    bucket_ns = NS_PER_DAY if bucket_s <= 0 else max(1, round(bucket_s * 1e9))
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
        periods_per_year=float(periods),
    )
