"""What a fold's training bars ask of the learned floors (:mod:`agent.policy.floors`).

Per instrument, the regime ``vol_ref`` floor target of a fold's training bars, and the floors a
fold's model trades with: the stored floors moved towards those targets. For the last fold
these are exactly the floors the run stores (:mod:`agent.train.registration`), and so what the
daemon and a later backtest read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from agent.policy.floors import floor_target, next_floor, vol_ema_of
from agent.policy.regime import RegimeConfig
from agent.train.env import InstrumentBars
from agent.train.folds import Bounds
from storage.values import FloorValue

__all__ = ["floor_targets", "fold_floors", "log_returns", "median_sq_returns", "stored_value"]


def log_returns(b: InstrumentBars, lo: int, hi: int) -> np.ndarray[Any, Any]:
    """The log-returns of the tradable, finite, positive mids of ``b[lo:hi]``."""
    mid = b.mid_ticks[lo:hi]
    ok = b.tradable[lo:hi] & np.isfinite(mid) & (mid > 0)
    m = mid[ok]
    return np.diff(np.log(m)) if m.shape[0] > 1 else np.zeros(0)


def floor_targets(
    bars: Mapping[str, InstrumentBars], per: Mapping[str, Bounds], regime: RegimeConfig
) -> dict[str, float | None]:
    """The floor target of each instrument's training bars in ``per``."""
    return {
        sym: floor_target(vol_ema_of(log_returns(bars[sym], a, e), regime), regime.floor_quantile)
        for sym, (a, e, _, _) in per.items()
    }


def median_sq_returns(bars: Mapping[str, InstrumentBars], per: Mapping[str, Bounds]) -> dict[str, float]:
    """The median squared log-return of each instrument's training bars in ``per`` (the regime
    trackers' warm start, kept in the checkpoint's metadata)."""
    out = {}
    for sym, (a, e, _, _) in per.items():
        lr = log_returns(bars[sym], a, e)
        out[sym] = float(np.median(lr**2)) if lr.size else 0.0
    return out


def stored_value(record: FloorValue | None) -> float | None:
    """The value of a stored floor (None: none stored)."""
    return float(record.value) if record is not None else None


def fold_floors(
    targets: Mapping[str, float | None],
    current: Mapping[str, FloorValue | None],
    rate: float,
    ids: Mapping[str, int],
) -> dict[int, float]:
    """The floors a fold's model trades with, by instrument id: the ``current`` stored floors
    moved a fraction ``rate`` towards the fold's ``targets`` (instruments with neither have none)."""
    out: dict[int, float] = {}
    for sym, target in targets.items():
        value = next_floor(stored_value(current.get(sym)), target, rate)
        if value is not None:
            out[ids[sym]] = value
    return out
