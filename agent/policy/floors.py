"""Learned floors: per-instrument values the system learns in training and keeps across runs.

The first is the regime ``vol_ref`` floor (:mod:`agent.policy.regime`). Each retrain measures a
target on its training data (a low quantile of the fold's ``vol_ema``, in squared log-return per
bar) and moves the stored floor a fraction ``rate`` of the way towards it in log space, so one odd
archive cannot swing it: ``new = exp(log old + rate * (log target - log old))``. The first
measurement of an instrument is taken as is. Storage keeps every value with its history under
its name (:data:`VOL_REF_FLOOR`); the trainer moves it (:mod:`agent.train.registration`), the
daemon and the backtests read the current value at start.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from agent.policy.regime import RegimeConfig, ema_series

__all__ = ["VOL_REF_FLOOR", "floor_target", "next_floor", "vol_ema_of"]

VOL_REF_FLOOR = "vol_ref_floor"
"""Name of the regime floor in the learned-floors table."""


def vol_ema_of(log_returns: Any, config: RegimeConfig) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The fast ``vol_ema`` series of one instrument's bar log-returns (``[T]``; non-finite
    returns are dropped first). Warm-started at the median of ``l**2``, like the daemon."""
    lr = np.asarray(log_returns, dtype=np.float64)
    sq = lr[np.isfinite(lr)] ** 2
    if sq.size == 0:
        return sq
    return ema_series(sq, config.fast_alpha, float(np.median(sq)))


def floor_target(vol_ema: Any, quantile: float) -> float | None:
    """The floor a training window asks for: the ``quantile`` of its positive, finite ``vol_ema``
    values; None when there are none (a flat or empty window teaches nothing)."""
    v = np.asarray(vol_ema, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        return None
    return float(np.quantile(v, quantile))


def next_floor(current: float | None, target: float | None, rate: float) -> float | None:
    """Move ``current`` a fraction ``rate`` towards ``target`` in log space (see module doc).

    No target keeps the current value; no current value takes the target.
    """
    if target is None or not (math.isfinite(target) and target > 0):
        return current
    if current is None or not (math.isfinite(current) and current > 0):
        return target
    return math.exp(math.log(current) + rate * (math.log(target) - math.log(current)))
