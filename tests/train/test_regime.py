"""Regime scale, its vectorised EMA and the learned floor that breaks the calm-stretch deadlock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.policy.floors import floor_target, next_floor, vol_ema_of
from agent.policy.regime import RegimeConfig, RegimeTracker, ema_series

CFG = RegimeConfig(fast_bars=20, slow_bars=5000, warmup_bars=200)
SCALE_FLOOR = 0.1


def _run(tracker: RegimeTracker, returns: np.ndarray) -> np.ndarray:
    return np.array([tracker.update(np.array([r]))[0] for r in returns])


def test_calm_stretch_deadlocks_without_the_floor_and_recovers_with_it() -> None:
    rng = np.random.default_rng(1)
    active = rng.normal(0.0, 1e-4, 3000)
    calm = rng.normal(0.0, 1e-7, 20_000)
    back = rng.normal(0.0, 1e-4, 3000)
    floor = floor_target(vol_ema_of(active, CFG), CFG.floor_quantile)
    assert floor is not None and 1e-9 < floor < 1e-8

    scales = {}
    for name, floors in (("no_floor", [0.0]), ("floor", [floor])):
        tracker = RegimeTracker(CFG, SCALE_FLOOR, floors)
        tracker.warm_start([np.median(active**2)])
        scales[name] = _run(tracker, np.concatenate([active, calm, back]))[-3000:]

    # Without the floor the slow tracker has followed the calm down: once activity returns the
    # scale sits at its minimum for hundreds of bars and is still far from normal 1,000 bars on.
    no_floor, with_floor = scales["no_floor"], scales["floor"]
    assert np.median(no_floor[:250]) == SCALE_FLOOR
    assert np.median(no_floor[:1000]) < 0.25
    # With the floor: normal sizing within one fast horizon (the ratio is bounded by floor/vol_ema).
    assert np.median(with_floor[20:250]) > 0.5
    assert np.median(with_floor[:1000]) > 2 * np.median(no_floor[:1000])


def test_ema_series_matches_the_tracker_recursion() -> None:
    rng = np.random.default_rng(2)
    lr = rng.normal(0.0, 1e-4, 1000)
    tracker = RegimeTracker(CFG, SCALE_FLOOR, [0.0])
    med = float(np.median(lr**2))
    tracker.warm_start([med])
    stepped = []
    for r in lr:
        tracker.update(np.array([r]))
        stepped.append(tracker.vol_ema[0])
    np.testing.assert_allclose(ema_series(lr**2, CFG.fast_alpha, med, block=64), stepped, rtol=1e-10)
    np.testing.assert_allclose(vol_ema_of(lr, CFG), stepped, rtol=1e-10)


class _VectorisedTracker:
    """The recursion as NumPy array code over the instruments, a bar at a time (the reference
    the tracker's scalar loop must match bit for bit)."""

    def __init__(self, t: RegimeTracker) -> None:
        self.cfg, self.floors, self.lo = t.config, t.floors.copy(), t.scale_floor
        self.vol_ema, self.vol_ref, self.count = t.vol_ema.copy(), t.vol_ref.copy(), t.count.copy()
        self.scale, self.rejected = t.scale.copy(), t.rejected

    def update(self, lr: np.ndarray) -> np.ndarray:
        cfg, ok = self.cfg, np.isfinite(lr)
        self.rejected += int((~ok & ~np.isnan(lr)).sum())
        sq = np.where(ok, lr * lr, 0.0)
        ema = np.where(ok & (self.count == 0), sq, (1 - cfg.fast_alpha) * self.vol_ema + cfg.fast_alpha * sq)
        count = self.count + ok
        running_mean = self.vol_ref + (ema - self.vol_ref) / np.maximum(count, 1)
        tracked = (1 - cfg.slow_alpha) * self.vol_ref + cfg.slow_alpha * ema
        ref = np.where(count <= cfg.warmup_bars, running_mean, tracked)
        self.vol_ema, self.vol_ref = np.where(ok, ema, self.vol_ema), np.where(ok, ref, self.vol_ref)
        self.count = count
        ratio = np.maximum(self.vol_ref, self.floors) / (self.vol_ema + 1e-30)
        scale = np.clip(np.where(np.isfinite(ratio), ratio, self.lo), self.lo, 1.0)
        self.scale = np.where(ok, scale, self.scale)
        return self.scale.copy()


def test_path_gives_the_bits_of_stepping_bar_by_bar() -> None:
    rng = np.random.default_rng(3)
    lr = rng.normal(0.0, 1e-4, (3000, 3))
    lr[rng.random(lr.shape) < 0.1] = np.nan  # bars that are not tradable
    lr[5, 0], lr[17, 1], lr[40, 2] = np.inf, -np.inf, 0.0
    lr[100:130, 2] = 1e200  # a square that overflows: inf, then inf - inf in the running mean
    cfg = RegimeConfig(fast_bars=20, slow_bars=500, warmup_bars=50)
    tracker = RegimeTracker(cfg, SCALE_FLOOR, [0.0, 2e-9, 1e-12])
    tracker.warm_start([np.nan, 1e-8, np.nan])  # one instrument warm, two cold
    reference = _VectorisedTracker(tracker)
    with np.errstate(over="ignore", invalid="ignore"):
        stepped = np.stack([reference.update(row) for row in lr])
    path = tracker.path(lr)
    np.testing.assert_array_equal(path, stepped)
    for name in ("vol_ema", "vol_ref", "count", "scale", "rejected"):
        np.testing.assert_array_equal(getattr(tracker, name), getattr(reference, name))
    assert tracker.rejected == 2 and np.isnan(stepped[130:, 2]).sum() == 0
    with np.errstate(invalid="ignore"):  # instrument 2's state overflowed above
        np.testing.assert_array_equal(tracker.update(lr[0]), reference.update(lr[0]))
    with pytest.raises(ValueError, match=r"\[T, 3\]"):
        tracker.path(lr[:, :2])


def test_tracker_cold_start_running_mean_and_bad_input() -> None:
    tracker = RegimeTracker(CFG, SCALE_FLOOR, [0.0, 0.0])
    # Both instruments see 0/0 at first: the scale is finite.
    scale = tracker.update(np.array([0.0, 1e-4]))
    assert np.all(np.isfinite(scale)) and scale[1] == 1.0
    before = (tracker.vol_ema.copy(), tracker.scale.copy())
    tracker.update(np.array([np.inf, np.nan]))
    assert tracker.rejected == 1
    np.testing.assert_array_equal(tracker.vol_ema, before[0])
    np.testing.assert_array_equal(tracker.scale, before[1])
    # During the warm-up vol_ref is the running mean of vol_ema.
    tracker = RegimeTracker(CFG, SCALE_FLOOR, [0.0])
    emas = []
    for r in (1e-4, 2e-4, 3e-4):
        tracker.update(np.array([r]))
        emas.append(tracker.vol_ema[0])
    assert tracker.vol_ref[0] == pytest.approx(np.mean(emas))
    with pytest.raises(ValueError, match="floors"):
        RegimeTracker(CFG, SCALE_FLOOR, [math.nan])


def test_update_at_steps_only_the_given_instruments_as_update_does() -> None:
    """The trading step's form (a round's instruments, in any order) leaves every state and
    scale exactly where the full-vector form with NaN elsewhere leaves them."""
    rng = np.random.default_rng(5)
    full = RegimeTracker(CFG, SCALE_FLOOR, [0.0, 1e-9, 0.0, 2e-9])
    some = RegimeTracker(CFG, SCALE_FLOOR, [0.0, 1e-9, 0.0, 2e-9])
    for step in range(600):
        chosen = rng.permutation(4)[: rng.integers(1, 5)].tolist()
        values = rng.normal(0.0, 1e-4, len(chosen))
        if step % 97 == 0:
            values[0] = np.inf if step % 2 else np.nan  # rejected, or no bar
        vector = np.full(4, np.nan)
        vector[chosen] = values
        expected = full.update(vector)[chosen]
        got = some.update_at(chosen, values.tolist())
        np.testing.assert_array_equal(got, expected)
    for name in ("vol_ema", "vol_ref", "count", "scale"):
        np.testing.assert_array_equal(getattr(some, name), getattr(full, name))
    assert some.rejected == full.rejected > 0


def test_floor_moves_slowly_in_log_space() -> None:
    assert next_floor(None, 4e-9, 0.2) == 4e-9
    assert next_floor(1e-8, None, 0.2) == 1e-8
    assert next_floor(1e-8, 1e-10, 0.5) == pytest.approx(1e-9)
    assert floor_target(np.zeros(10), 0.1) is None
    with pytest.raises(ValueError, match="floor_quantile"):
        RegimeConfig(floor_quantile=1.5)
