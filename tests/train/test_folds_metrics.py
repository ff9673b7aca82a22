"""Walk-forward fold layout and the out-of-sample metrics (hand-computed)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agent.backtest.metrics import NS_PER_DAY, bucket_sums, choose_bucket_s, performance
from agent.train.errors import TrainError
from agent.train.folds import plan_folds, walk_forward_folds


def test_rolling_folds_tile_the_test_period_with_a_gap() -> None:
    folds = walk_forward_folds(100, n_folds=3, train_bars=40, test_bars=15, gap_bars=5)
    assert [(f.train_start, f.train_end, f.test_start, f.test_end) for f in folds] == [
        (0, 40, 45, 60),
        (15, 55, 60, 75),
        (30, 70, 75, 90),
    ]
    for a, b in itertools.pairwise(folds):
        assert a.test_end == b.test_start  # tiled out-of-sample record
    for f in folds:
        assert f.test_start - f.train_end == 5 and f.train_end - f.train_start == 40
    anchored = walk_forward_folds(100, n_folds=3, train_bars=40, test_bars=15, gap_bars=5, anchored=True)
    assert [f.train_start for f in anchored] == [0, 0, 0] and anchored[2].train_end == 70


def test_plan_uses_the_timeline_and_rejects_too_little_data() -> None:
    folds = plan_folds(1000, n_folds=4, train_test_ratio=2.0, gap_bars=40)
    assert folds[-1].test_end <= 1000 and folds[0].test_start - folds[0].train_end == 40
    assert folds[0].test_end - folds[0].test_start == 160  # (1000 - 40) // 6
    with pytest.raises(TrainError, match="needs 130 bars"):
        walk_forward_folds(100, n_folds=2, train_bars=50, test_bars=30, gap_bars=20)
    with pytest.raises(TrainError, match="too few"):
        plan_folds(10, n_folds=4, train_test_ratio=3.0, gap_bars=40)


def test_bucket_sums_and_daily_sharpe() -> None:
    # Four days, one bar per hour for 3 hours each; daily P&L 3, 6, -3, 6.
    day_pnl = [1.0, 2.0, -1.0, 2.0]
    ts = np.array([d * NS_PER_DAY + h * 3_600_000_000_000 for d in range(4) for h in range(3)])
    pnl = np.repeat(day_pnl, 3)
    np.testing.assert_allclose(bucket_sums(pnl, ts, NS_PER_DAY), [3, 6, -3, 6])
    perf = performance(pnl, np.zeros(12), np.ones(12), np.ones(12), ts, bucket_s=86_400)
    daily = np.array([3.0, 6.0, -3.0, 6.0])
    assert perf.sharpe == pytest.approx(daily.mean() / daily.std(ddof=1) * math.sqrt(252))
    assert perf.sortino == pytest.approx(daily.mean() / math.sqrt(9 / 4) * math.sqrt(252))
    assert perf.periods_per_year == 252 and perf.n_days == 4 and perf.turnover == 3.0
    assert perf.bucket_s == 86_400
    assert perf.max_drawdown == pytest.approx(3.0) and perf.pnl == pytest.approx(12.0)
    assert perf.hit_rate == pytest.approx(9 / 12)
    # Hourly buckets: 3 per day -> 756 periods a year.
    hourly = performance(pnl, np.zeros(12), np.zeros(12), np.ones(12), ts, bucket_s=3600)
    assert hourly.periods_per_year == 756
    assert hourly.sharpe == pytest.approx(pnl.mean() / pnl.std(ddof=1) * math.sqrt(756))


def test_automatic_bucket_is_daily_over_twenty_days_else_intraday_with_twenty_returns() -> None:
    rng = np.random.default_rng(0)
    # 25 days, 8 hourly bars a day: daily buckets.
    ts = np.array([d * NS_PER_DAY + h * 3_600_000_000_000 for d in range(25) for h in range(8)])
    pnl = rng.normal(size=ts.size)
    assert choose_bucket_s(ts) == 86_400
    zeros, ones = np.zeros(ts.size), np.ones(ts.size)
    daily = performance(pnl, zeros, zeros, ones, ts, bucket_s=86_400)
    assert performance(pnl, zeros, zeros, ones, ts) == daily
    # One 3-hour test block of 1-second bars: 4-hour and hourly buckets give 1-3 returns, 30
    # minutes 6, 15 minutes 12, 5 minutes 36 (the first with 20 or more).
    ts = 7 * NS_PER_DAY + np.arange(3 * 3600) * 1_000_000_000
    pnl = rng.normal(size=ts.size)
    assert choose_bucket_s(ts) == 300
    auto = performance(pnl, np.zeros(ts.size), np.zeros(ts.size), np.ones(ts.size), ts)
    five = bucket_sums(pnl, ts, 300 * 1_000_000_000)
    assert auto.bucket_s == 300 and auto.periods_per_year == 252 * 36
    assert auto.sharpe == pytest.approx(five.mean() / five.std(ddof=1) * math.sqrt(252 * 36))
    # The choice depends on the timestamps only: any P&L on the same bars gets the same bucket.
    assert performance(np.zeros(ts.size), pnl, pnl, pnl, ts).bucket_s == 300
    # Too few bars for 20 returns at any bucket: the shortest.
    assert choose_bucket_s(np.arange(5) * 1_000_000_000) == 1.0


def test_flat_and_empty_records_have_zero_sharpe() -> None:
    ts = np.arange(10) * NS_PER_DAY
    flat = performance(np.zeros(10), np.zeros(10), np.zeros(10), np.zeros(10), ts)
    assert flat.sharpe == 0 and flat.hit_rate == 0 and flat.max_drawdown == 0
    assert performance([], [], [], [], []).n_bars == 0
    # Drawdown is measured from the running peak of equity, in time order whatever the row order.
    perf = performance([-1.0, 5.0, -4.0, 1.0], np.zeros(4), np.zeros(4), np.ones(4), [3, 0, 1, 2])
    assert perf.max_drawdown == pytest.approx(4.0)
