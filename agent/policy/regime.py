"""Volatility-regime scale with a learned floor (DESIGN section 7, ALGORITHMS section 4).

Per instrument, from the bar log-returns ``l`` of the mid (dimensionless; both trackers are
variances in units of squared log-return per bar):

* ``vol_ema``: fast EMA of ``l**2`` (``lf = 2 / (fast_bars + 1)``);
* ``vol_ref``: the running mean of ``vol_ema`` over its first ``warmup_bars`` observations (or
  warm-started at the training median of ``l**2``), then a slow EMA of ``vol_ema``
  (``ls = 2 / (slow_bars + 1)``);
* ``vol_ref_eff = max(vol_ref, floor)`` where ``floor`` is the instrument's learned floor
  (:mod:`agent.policy.floors`; 0 = none);
* ``scale = clamp(vol_ref_eff / (vol_ema + eps), scale_floor, 1)`` (the variance ratio, matching
  Kelly's ``1 / sigma**2``).

Without the floor a long calm stretch drags ``vol_ref`` towards zero; when activity returns the
ratio collapses to ``scale_floor`` and stays there for about ``slow_bars`` bars (the deadlock).
The floor bounds the ratio below by ``floor / vol_ema`` whatever the tracker's history.

:class:`RegimeTracker` is the incremental form the daemon steps once per bar;
:func:`ema_series` is the vectorised form over a whole series (training and floors), with the
same recursion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

__all__ = ["RegimeConfig", "RegimeTracker", "ema_series"]

_EPS = 1e-30
"""Added to ``vol_ema`` in the ratio: far below any real squared bar log-return (a 1e-6
relative move squared is 1e-12), it only keeps 0/0 finite."""


class RegimeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Horizons of the regime trackers, in bars of the decision clock."""

    fast_bars: int = 20
    """n_f: horizon of ``vol_ema`` (lf = 2 / (n_f + 1))."""
    slow_bars: int = 2000
    """n_s: horizon of the slow ``vol_ref`` tracker (ls = 2 / (n_s + 1))."""
    warmup_bars: int = 200
    """Without a warm start, ``vol_ref`` is the running mean of ``vol_ema`` for this many bars."""
    floor_quantile: float = 0.1
    """The learned floor's target: this quantile of the training fold's ``vol_ema``."""
    floor_rate: float = 0.2
    """Each retrain moves the stored floor this fraction of the way (in log space) to the target."""

    def __post_init__(self) -> None:
        if self.fast_bars < 1 or self.slow_bars < 1 or self.warmup_bars < 1:
            raise ValueError("regime fast_bars, slow_bars and warmup_bars must be >= 1")
        if self.slow_bars <= self.fast_bars:
            raise ValueError("regime slow_bars must exceed fast_bars")
        if not 0.0 < self.floor_quantile < 1.0:
            raise ValueError("regime floor_quantile must be in (0, 1)")
        if not 0.0 < self.floor_rate <= 1.0:
            raise ValueError("regime floor_rate must be in (0, 1]")

    @property
    def fast_alpha(self) -> float:
        return 2.0 / (self.fast_bars + 1)

    @property
    def slow_alpha(self) -> float:
        return 2.0 / (self.slow_bars + 1)


class RegimeTracker:
    """Incremental regime scale for ``n`` instruments.

    ``floors`` are the learned vol_ref floors (squared log-return per bar; 0 = none).
    Non-finite returns are skipped: that instrument's state and scale stay as they were, and
    :attr:`rejected` counts them. The state is held as Python floats (the daemon steps it once
    per bar: a NumPy scalar read or write costs more than the arithmetic); :attr:`vol_ema`,
    :attr:`vol_ref`, :attr:`count` and :attr:`scale` read it as ``[n]`` arrays.
    """

    def __init__(self, config: RegimeConfig, scale_floor: float, floors: Any) -> None:
        if not 0.0 < scale_floor <= 1.0:
            raise ValueError("scale_floor must be in (0, 1]")
        self.config = config
        self.scale_floor = scale_floor
        learned = np.asarray(floors, dtype=np.float64)
        if learned.ndim != 1 or not np.all(np.isfinite(learned) & (learned >= 0)):
            raise ValueError("floors must be a 1-D array of finite values >= 0")
        self._floor: list[float] = learned.tolist()
        n = len(self._floor)
        self._ema, self._ref, self._scale = [0.0] * n, [0.0] * n, [1.0] * n
        self._count = [0] * n
        self._alphas = (config.fast_alpha, 1 - config.fast_alpha, config.slow_alpha, 1 - config.slow_alpha)
        self.rejected = 0

    @property
    def floors(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.array(self._floor)

    @property
    def vol_ema(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.array(self._ema)

    @property
    def vol_ref(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.array(self._ref)

    @property
    def count(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Observations seen per instrument (a warm start counts as a full warm-up)."""
        return np.array(self._count, dtype=np.int64)

    @property
    def scale(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.array(self._scale)

    def warm_start(self, median_sq_return: Any) -> None:
        """Start both trackers at the training median of ``l**2`` (``[n]``; non-finite or <= 0
        entries leave that instrument cold)."""
        med = np.broadcast_to(np.asarray(median_sq_return, dtype=np.float64), (len(self._floor),))
        warmup = self.config.warmup_bars
        for i, m in enumerate(med.tolist()):
            if math.isfinite(m) and m > 0:
                self._ema[i] = self._ref[i] = m
                self._count[i] = max(self._count[i], warmup)
                self._scale[i] = self._scale_of(m, m, self._floor[i])

    def update(self, log_returns: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Step every instrument with its bar log-return (``[n]``; NaN = no bar); returns the scale."""
        values = [float(x) for x in log_returns]
        if len(values) != len(self._floor):
            raise ValueError(f"log_returns must be [{len(self._floor)}], got {len(values)} values")
        self.update_at(range(len(values)), values)
        return np.array(self._scale)

    def update_at(self, indices: Sequence[int], log_returns: Sequence[float]) -> list[float]:
        """:meth:`update` of the instruments ``indices`` only (distinct), each with its bar
        log-return (a Python float; NaN = no bar), the others left as they are; the scales of
        ``indices`` after it, in their order (the trading step's bars of one round)."""
        scales = self._scale
        out: list[float] = []
        for i, x in zip(indices, log_returns, strict=True):
            if not math.isnan(x):  # a NaN leaves the instrument as it is
                self._path_of(i, (x,))
            out.append(scales[i])
        return out

    def path(self, log_returns: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Step the trackers over each row of ``log_returns`` (``[T, n]``, a bar each); the
        scales ``[T, n]``. The recursion's one implementation: a scalar loop per instrument, on
        Python floats (a NumPy call per bar costs ~20x more on a backtest's million bars)."""
        lr = np.asarray(log_returns, dtype=np.float64)
        if lr.ndim != 2 or lr.shape[1] != len(self._floor):
            raise ValueError(f"log_returns must be [T, {len(self._floor)}], got {lr.shape}")
        out = np.empty_like(lr)
        for i in range(lr.shape[1]):
            out[:, i] = self._path_of(i, lr[:, i].tolist())
        return out

    def _path_of(self, i: int, returns: Sequence[float]) -> list[float]:
        """Instrument ``i``'s scales over ``returns``, its state advanced (:meth:`path`)."""
        fast, keep_fast, slow, keep_slow = self._alphas
        warmup, floor = self.config.warmup_bars, self._floor[i]
        ema, ref, scale, count = self._ema[i], self._ref[i], self._scale[i], self._count[i]
        out: list[float] = []
        append, isfinite, scale_of = out.append, math.isfinite, self._scale_of  # looked up once
        for x in returns:
            if isfinite(x):
                sq = x * x
                ema = sq if count == 0 else keep_fast * ema + fast * sq
                count += 1
                ref = ref + (ema - ref) / count if count <= warmup else keep_slow * ref + slow * ema
                scale = scale_of(ema, ref, floor)
            elif not math.isnan(x):
                self.rejected += 1  # +-inf; NaN is "no bar"
            append(scale)
        self._ema[i], self._ref[i], self._scale[i], self._count[i] = ema, ref, scale, count
        return out

    def _scale_of(self, ema: float, ref: float, floor: float) -> float:
        """``clamp(max(ref, floor) / (ema + eps), scale_floor, 1)``; ``scale_floor`` when not finite."""
        ratio = (ref if math.isnan(ref) or ref >= floor else floor) / (ema + _EPS)  # NaN wins, as np.maximum
        low = self.scale_floor
        if not math.isfinite(ratio) or ratio < low:
            return low
        return 1.0 if ratio > 1.0 else ratio


def ema_series(x: Any, alpha: float, init: float, block: int = 256) -> np.ndarray[Any, np.dtype[np.float64]]:
    """EMA of a series, ``y_t = (1 - alpha) y_{t-1} + alpha x_t`` with ``y_{-1} = init``.

    ``x``: ``[T]`` (float64). Vectorised in blocks of ``block`` steps: inside a block
    ``y = W x + a^(t+1) y_prev`` with the lower-triangular ``W[t, s] = alpha a^(t-s)``
    (``a = 1 - alpha``), so a million bars cost a few hundred small matrix products instead of a
    Python loop. Same recursion as :meth:`RegimeTracker.update` after its first observation.
    """
    if not 0.0 < alpha <= 1.0 or not math.isfinite(init):
        raise ValueError("ema_series needs 0 < alpha <= 1 and a finite init")
    values = np.asarray(x, dtype=np.float64)
    a = 1.0 - alpha
    idx = np.arange(block)
    lag = idx[:, None] - idx[None, :]
    weights = np.where(lag >= 0, alpha * a ** np.maximum(lag, 0), 0.0)
    carry = a ** (idx + 1.0)
    out = np.empty_like(values)
    prev = float(init)
    for start in range(0, values.shape[0], block):
        chunk = values[start : start + block]
        m = chunk.shape[0]
        y = weights[:m, :m] @ chunk + carry[:m] * prev
        out[start : start + m] = y
        prev = float(y[-1])
    return out
