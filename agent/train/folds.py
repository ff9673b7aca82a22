"""Walk-forward folds with a purge/embargo gap (ALGORITHMS section 5).

Fold ``k`` on a timeline of ``n`` bars, with train window ``W``, gap ``g`` and test block ``T``::

    E_k = W + k * T
    train [S_k, E_k)      S_k = E_k - W (rolling) or 0 (anchored, expanding)
    gap   [E_k, E_k + g)  never trained on, never tested
    test  [E_k + g, E_k + g + T)

so the test blocks tile the out-of-sample period ``[W + g, W + g + n_folds * T)`` and the
concatenated test P&L is one continuous out-of-sample record. The gap must be at least the
window ``K`` plus the longest label horizon ``h`` (n-step return, return-head horizon): the
last training label then ends before the first test window begins, which is AFML's purge for
walk-forward.

A run plans its folds on the timeline of the instrument with the most bars and maps them to
every instrument by time (:func:`fold_ranges`), purging each instrument's training bars closer
than the gap (:func:`gap_bars`) to its test block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from agent.model import ModelConfig
from agent.train.config import TrainConfig
from agent.train.env import InstrumentBars
from agent.train.errors import TrainError

__all__ = ["Bounds", "Fold", "MappedFold", "fold_ranges", "gap_bars", "plan_folds", "walk_forward_folds"]

Bounds = tuple[int, int, int, int]
"""``(train_start, train_end, test_start, test_end)``, half-open: a fold's edges as times (ns) on
the reference timeline, or one instrument's bar indices."""

MappedFold = tuple[Bounds, dict[str, Bounds]]
"""A fold's edges and, per instrument, its bar index ranges with the purge applied."""


@dataclass(frozen=True, slots=True)
class Fold:
    """Bar index ranges (half-open) of one fold."""

    index: int
    train_start: int
    train_end: int
    test_start: int
    test_end: int

    @property
    def train(self) -> slice:
        return slice(self.train_start, self.train_end)

    @property
    def test(self) -> slice:
        return slice(self.test_start, self.test_end)


def walk_forward_folds(
    n_bars: int, *, n_folds: int, train_bars: int, test_bars: int, gap_bars: int, anchored: bool = False
) -> list[Fold]:
    """The folds of the module docstring; :class:`TrainError` when they do not fit in ``n_bars``."""
    if n_folds < 1 or train_bars < 1 or test_bars < 1 or gap_bars < 0:
        raise TrainError(
            f"walk-forward needs n_folds, train and test bars >= 1 and gap >= 0 "
            f"(got {n_folds}, {train_bars}, {test_bars}, {gap_bars})"
        )
    needed = train_bars + gap_bars + n_folds * test_bars
    if needed > n_bars:
        raise TrainError(
            f"walk-forward needs {needed} bars ({n_folds} folds: train {train_bars} + gap {gap_bars} "
            f"+ {n_folds} x test {test_bars}), the data has {n_bars}"
        )
    folds = []
    for k in range(n_folds):
        end = train_bars + k * test_bars
        start = 0 if anchored else end - train_bars
        folds.append(Fold(k, start, end, end + gap_bars, end + gap_bars + test_bars))
    return folds


def plan_folds(
    n_bars: int, *, n_folds: int, train_test_ratio: float, gap_bars: int, anchored: bool = False
) -> list[Fold]:
    """Folds that use the whole timeline: the test block ``T = (n - g) // (ratio + n_folds)`` and
    the train window ``W = n - g - n_folds * T`` (about ``ratio * T``, taking the remainder)."""
    if train_test_ratio <= 0:
        raise TrainError(f"train_test_ratio must be > 0, got {train_test_ratio}")
    test = int((n_bars - gap_bars) // (train_test_ratio + n_folds))
    if test < 1:
        raise TrainError(f"{n_bars} bars are too few for {n_folds} folds with a {gap_bars}-bar gap")
    train = n_bars - gap_bars - n_folds * test
    return walk_forward_folds(
        n_bars, n_folds=n_folds, train_bars=train, test_bars=test, gap_bars=gap_bars, anchored=anchored
    )


def gap_bars(model: ModelConfig, config: TrainConfig) -> int:
    """The purge gap: ``train.gap_bars``, raised to at least the window plus the longest label
    horizon (n-step return, return-head horizon)."""
    return max(config.gap_bars, model.window + max(config.n_step, model.return_horizon))


def fold_ranges(
    bars: Mapping[str, InstrumentBars], config: TrainConfig, window: int, gap: int
) -> list[MappedFold]:
    """Fold boundaries as times on the reference timeline and per-instrument index ranges
    ``(train_start, train_end, test_start, test_end)`` with the purge applied; :class:`TrainError`
    when an instrument has fewer than ``window + 2`` bars in a fold's training or test span."""
    ref = max(bars.values(), key=len).ts_ns
    folds = plan_folds(
        ref.shape[0],
        n_folds=config.folds,
        train_test_ratio=config.train_test_ratio,
        gap_bars=gap,
        anchored=config.anchored,
    )
    out = []
    for f in folds:
        edges = [
            int(ref[i]) if i < ref.shape[0] else int(ref[-1]) + 1
            for i in (f.train_start, f.train_end, f.test_start, f.test_end)
        ]
        per: dict[str, Bounds] = {}
        for symbol, b in bars.items():
            a, e, s, t = (int(x) for x in np.searchsorted(b.ts_ns, edges))
            e = min(e, s - gap)  # purge: never closer than the gap to the test block
            if e - a < window + 2 or t - s < window + 2:
                raise TrainError(f"fold {f.index}: instrument {symbol} has too few bars in the fold")
            per[symbol] = (a, e, s, t)
        out.append(((edges[0], edges[1], edges[2], edges[3]), per))
    return out
