"""n-step returns, the replay ring, and the gates' decisions and statistics (hand-computed)."""

from __future__ import annotations

import math
from statistics import NormalDist

import msgspec
import numpy as np
import pytest

from agent.model import ModelConfig
from agent.train.config import TrainConfig
from agent.train.env import Rollout
from agent.train.gates import (
    GateEvent,
    PnlSeries,
    action_entropy,
    drift_floor,
    edge_t,
    expected_max_sharpe,
    kill_criteria,
    nonfinite_gradients,
    probabilistic_sharpe,
    promotion,
    q_drift,
    sharpe_stats,
)
from agent.train.replay import NStepBuffer, Replay

K = 2


def _state(t: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.array(t, dtype=np.int64), np.full((len(t), K, 2), float(t[0]), dtype=np.float32)


def test_nstep_returns_truncate_at_terminals() -> None:
    buf = NStepBuffer(3, 0.5, n_envs=2, window=K, n_agent=2, xp=np)
    rewards = [[1.0, 1.0], [2.0, 2.0], [4.0, 4.0], [8.0, 8.0]]
    dones = [[False, False], [False, True], [False, False], [False, False]]
    out = []
    for step in range(4):
        got = buf.push(
            _state([step, 10 + step]),
            np.array([step % 3, 1]),
            np.array(rewards[step], dtype=np.float32),
            np.array(dones[step]),
            _state([step + 1, 11 + step]),
        )
        out.append(got)
    assert out[0] is None and out[1] is None
    first, second = out[2], out[3]
    assert first is not None and second is not None
    # env 0: 1 + 0.5*2 + 0.25*4 = 3, bootstrapped with 0.5^3 from the state after step 2.
    # env 1: terminal at its second step: 1 + 0.5*2 = 2, no bootstrap.
    np.testing.assert_allclose(first.reward, [3.0, 2.0])
    np.testing.assert_allclose(first.discount, [0.125, 0.0])
    np.testing.assert_array_equal(first.t, [0, 10])
    np.testing.assert_array_equal(first.t_next, [3, 13])
    # The transition of step 1: env 0 sums 2 + 0.5*4 + 0.25*8; env 1's step 1 was its terminal,
    # so the rewards of the episode that followed never leak into it.
    np.testing.assert_allclose(second.reward, [6.0, 2.0])
    np.testing.assert_allclose(second.discount, [0.125, 0.0])


def test_replay_ring_overwrites_oldest_and_samples_reproducibly() -> None:
    rep = Replay(5, K, 2, np)
    buf = NStepBuffer(1, 0.9, n_envs=3, window=K, n_agent=2, xp=np)
    for step in range(3):
        tr = buf.push(
            _state([step] * 3),
            np.zeros(3, dtype=np.int64),
            np.ones(3, dtype=np.float32),
            np.zeros(3, bool),
            _state([step + 1] * 3),
        )
        assert tr is not None
        rep.add(tr)
    assert rep.size == 5
    assert sorted(rep.t.tolist()) == [1, 1, 2, 2, 2]  # the first step's 3 rows and one more were overwritten
    a = rep.sample(np.random.default_rng(4), 16)
    b = rep.sample(np.random.default_rng(4), 16)
    np.testing.assert_array_equal(a.t, b.t)
    np.testing.assert_allclose(a.discount, 0.9)


MODEL = ModelConfig(v_min=-3.0, v_max=5.0)
CFG = TrainConfig(drift_ratio=2.0, drift_abs_frac=0.3)
PHI = NormalDist().cdf


def test_drift_floor_scales_with_the_support() -> None:
    assert drift_floor(MODEL, CFG) == pytest.approx(0.3 * 5.0)
    assert drift_floor(ModelConfig(v_min=-10.0, v_max=10.0), CFG) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("q", "q_prev", "passed"),
    [
        (1.0, 0.1, True),  # grew 10x but below the floor 1.5
        (1.6, 0.9, True),  # above the floor but not doubled
        (1.6, 0.5, False),
        (-3.0, 1.0, False),
        (math.nan, 1.0, False),
        (1.0, math.inf, False),
        (-4.9, None, True),  # a fold's first epoch: only finiteness
        (math.nan, None, False),
    ],
)
def test_q_drift_needs_both_growth_and_size(q: float, q_prev: float | None, passed: bool) -> None:
    event = q_drift(q, q_prev, drift_floor(MODEL, CFG), CFG, fold_index=1, epoch=3)
    assert event.passed is passed and event.fold_index == 1 and event.epoch == 3
    assert event.values["drift_abs"] == pytest.approx(1.5)
    assert event.values["q_prev"] == (q_prev if q_prev is None or math.isfinite(q_prev) else repr(q_prev))
    msgspec.json.encode(event)


def test_nonfinite_gradient_rate() -> None:
    cfg = TrainConfig(max_nonfinite_rate=0.1)
    ok = nonfinite_gradients(10, 100, cfg, fold_index=0, epoch=2)
    bad = nonfinite_gradients(11, 100, cfg, fold_index=0, epoch=2)
    idle = nonfinite_gradients(0, 0, cfg, fold_index=0, epoch=0)
    assert ok.passed and idle.passed and not bad.passed
    assert bad.kind == "nonfinite_gradients" and bad.values["rate"] == pytest.approx(0.11)
    assert "11 of 100 updates" in bad.message


def test_sharpe_stats_and_probabilistic_sharpe_by_hand() -> None:
    # r = 2, -1, 3, 0: mean 1, deviations 1, -2, 2, -1 (sum of squares 10), std = sqrt(10/3);
    # m2 = 2.5, m3 = 0, m4 = 34/4 = 8.5: skew 0, kurtosis 8.5 / 6.25 = 1.36.
    s = sharpe_stats([2.0, -1.0, 3.0, 0.0])
    sr = 1.0 / math.sqrt(10.0 / 3.0)
    assert (s.n, s.mean) == (4, 1.0) and s.sharpe == pytest.approx(sr)
    assert s.skew == pytest.approx(0.0, abs=1e-12) and s.kurtosis == pytest.approx(1.36)
    expected = PHI(sr * math.sqrt(3.0) / math.sqrt(1.0 + 0.36 / 4.0 * sr**2))
    assert probabilistic_sharpe([2.0, -1.0, 3.0, 0.0]) == pytest.approx(expected)
    assert expected == pytest.approx(0.8254, abs=1e-4)
    # r = 0, 0, 0, 4: mean 1, std 2, SR 0.5; m2 = 3, m3 = 24/4 = 6, m4 = 84/4 = 21:
    # skew 6 / 3^1.5, kurtosis 21 / 9. Positive skew makes the same SR more credible.
    skew, kurt = 6.0 / 3.0**1.5, 21.0 / 9.0
    var = 1.0 - skew * 0.5 + (kurt - 1.0) / 4.0 * 0.25
    assert probabilistic_sharpe([0.0, 0.0, 0.0, 4.0]) == pytest.approx(
        PHI(0.5 * math.sqrt(3.0) / math.sqrt(var))
    )
    assert probabilistic_sharpe([0.0, 0.0, 0.0, 4.0], benchmark=0.5) == pytest.approx(0.5)
    assert math.isnan(probabilistic_sharpe([1.0, 1.0, 1.0]))  # no variance: undefined
    assert math.isnan(probabilistic_sharpe([1.0]))


def test_psr_at_095_on_zero_mean_noise_about_5_percent() -> None:
    rng = np.random.default_rng(0)
    draws = rng.standard_normal((4000, 60))
    rate = np.mean([probabilistic_sharpe(r) >= 0.95 for r in draws])
    assert 0.04 <= rate <= 0.065, rate  # binomial sd 0.0035 around 0.05


def test_expected_max_sharpe_and_deflation() -> None:
    assert expected_max_sharpe(1, 4.0) == 0.0
    inv = NormalDist().inv_cdf
    g = 0.5772156649015329
    z = (1 - g) * inv(0.9) + g * inv(1 - 1 / (10 * math.e))
    assert expected_max_sharpe(10, 4.0) == pytest.approx(2.0 * z)
    assert z == pytest.approx(1.5746, abs=1e-4)  # E[max of 10 N(0, 1)] is 1.5388: a close approximation
    with pytest.raises(ValueError, match="n_trials"):
        expected_max_sharpe(0, 1.0)
    # The best of 10 zero-edge trials: against flat it looks significant about 40% of the time;
    # against the deflated benchmark at most the nominal 5% (the test is conservative).
    rng = np.random.default_rng(1)
    n, trials, plain, deflated = 60, 10, 0, 0
    for _ in range(1000):
        x = rng.standard_normal((trials, n))
        best = x[np.argmax(x.mean(axis=1) / x.std(axis=1, ddof=1))]
        plain += probabilistic_sharpe(best) >= 0.95
        deflated += probabilistic_sharpe(best, expected_max_sharpe(trials, 1.0 / (n - 1))) >= 0.95
    assert plain / 1000 > 0.3 and deflated / 1000 <= 0.05


def _rollout(gross: list[float], held: list[int], cost: float = 0.0) -> Rollout:
    n = len(gross)
    g = np.asarray(gross, dtype=np.float64)
    costs = np.full(n, cost)
    return Rollout(
        bar=np.arange(n),
        pnl=g - costs,
        cost=costs,
        traded=np.zeros(n),
        held=np.asarray(held, dtype=np.float64),
        action=np.ones(n, dtype=np.int64),
        ts_ns=np.arange(n, dtype=np.int64),
        instrument=np.zeros(n, dtype=np.int32),
    )


def test_edge_t_is_welch_t_on_gross_pnl_per_position_bar() -> None:
    # Candidate held on bars 0-3 (gross 3, 1, 2, 2 per contract: mean 2, var 2/3); random on
    # bars with gross 1, -1, 0 (mean 0, var 1). Costs do not count; flat bars do not count.
    cand = _rollout([3.0, 1.0, 4.0, 2.0, 9.0], [1, 1, 2, 1, 0], cost=5.0)
    rand = _rollout([1.0, -1.0, 0.0, 7.0], [1, 1, 1, 0], cost=1.0)
    assert edge_t(cand, rand) == pytest.approx(2.0 / math.sqrt((2.0 / 3.0) / 4 + 1.0 / 3))
    assert math.isnan(edge_t(_rollout([1.0, 2.0], [0, 1]), rand))  # held on one bar only


def test_kill_criteria_thresholds_scale_with_the_support() -> None:
    assert action_entropy([1.0, 0.0, 0.0]) == 0.0
    assert action_entropy([0.5, 0.5, 0.0]) == pytest.approx(math.log(2))
    cfg = TrainConfig(
        min_q_spread_frac=0.01, min_action_entropy=0.1, min_edge_t=3.0, min_early_q_move_frac=0.001
    )
    model = ModelConfig(v_min=-5.0, v_max=5.0)  # width 10: spread >= 0.1, early move >= 0.01
    rng = np.random.default_rng(3)
    edge = _rollout(list(1.0 + rng.standard_normal(400)), [1] * 400)
    noise = _rollout(list(rng.standard_normal(400)), [1] * 400)
    kills = kill_criteria(
        fold_index=2,
        q_spread=0.12,
        entropy=0.0,
        early_q_move=0.009,
        candidate=edge,
        random=noise,
        model=model,
        config=cfg,
    )
    assert {k.kind: k.passed for k in kills} == {
        "kill_q_spread": True,
        "kill_action_entropy": False,
        "kill_return_vs_random": True,
        "kill_early_q_move": False,
    }
    assert all(k.fold_index == 2 and k.message.startswith("fold 2: ") for k in kills)
    assert kills[0].values == {"value": 0.12, "threshold": pytest.approx(0.1), "support_width": 10.0}
    assert kills[3].values["threshold"] == pytest.approx(0.01)
    same = kill_criteria(
        fold_index=0,
        q_spread=0.12,
        entropy=0.5,
        early_q_move=0.5,
        candidate=noise,
        random=noise,
        model=model,
        config=cfg,
    )
    assert [k.kind for k in same if not k.passed] == ["kill_return_vs_random"]
    assert same[2].values["value"] == pytest.approx(0.0)


BUCKET = 300.0
NS = 1_000_000_000


def _series(bucket_pnl: np.ndarray, bars_per_bucket: int = 3) -> PnlSeries:
    """Per-bar P&L whose 300 s buckets sum to ``bucket_pnl`` (bars 100 s apart)."""
    n = bucket_pnl.shape[0] * bars_per_bucket
    ts = (np.arange(n) * 100 * NS).astype(np.int64)
    return PnlSeries(np.repeat(bucket_pnl / bars_per_bucket, bars_per_bucket), ts)


def _promote(candidate: PnlSeries, incumbent: PnlSeries | None = None, **kw: object) -> GateEvent:
    zero = _series(np.zeros(candidate.pnl.shape[0] // 3))
    cfg = TrainConfig(sharpe_bucket_s=BUCKET, max_drawdown=100.0)
    args: dict[str, object] = {
        "halted": False,
        "kills_passed": True,
        "candidate": candidate,
        "baselines": {"long": zero, "random": zero},
        "incumbent": incumbent,
        "max_drawdown": 50.0,
        "n_trials": 1,
        "config": cfg,
    }
    return promotion(**(args | kw))  # type: ignore[arg-type]


def test_promotion_needs_significance_against_flat() -> None:
    rng = np.random.default_rng(7)
    noise = rng.standard_normal(80)
    good = _promote(_series(noise + 0.6))
    assert good.passed and good.message == "promotion criteria met"
    v = good.values
    assert v["n_buckets"] == 80 and v["bucket_s"] == BUCKET and v["psr"] >= 0.95
    assert v["psr"] == pytest.approx(probabilistic_sharpe(noise + 0.6))
    msgspec.json.encode(good)
    weak = _promote(_series(noise - noise.mean() + 0.05))  # positive P&L, far from significant
    assert not weak.passed
    assert "not significant against flat" in weak.message
    # Deflated for 1,000 trials the bar rises: SR* = expected_max_sharpe(1000, 1/79).
    shy = _series(noise - noise.mean() + 0.35)
    assert _promote(shy).passed
    deflated = _promote(shy, n_trials=1000)
    assert not deflated.passed
    assert "best of 1000 zero-edge trials" in deflated.message
    assert deflated.values["sharpe_benchmark"] == pytest.approx(expected_max_sharpe(1000, 1 / 79))
    # The diagnostic before costs: the same deflated test, never gated.
    costly = _promote(_series(noise - noise.mean() - 0.2), candidate_gross=_series(noise + 0.6))
    assert not costly.passed and costly.values["gross_psr"] == pytest.approx(good.values["psr"])
    assert "gross_psr" not in good.values
    flat = _promote(_series(np.zeros(80)))
    assert not flat.passed and flat.values["psr"] == "nan"


def test_promotion_needs_the_baselines_beaten_on_the_same_buckets() -> None:
    rng = np.random.default_rng(8)
    market = rng.standard_normal(80) + 0.5
    cand = _series(market * 0.5 + 0.1)
    long = _series(market)  # the market drifted up: always-long earned more
    event = _promote(cand, baselines={"long": long, "random": _series(-np.abs(market))})
    assert not event.passed and "over the long baseline: not above it" in event.message
    assert "random" not in event.message
    assert event.values["mean_over_long"] == pytest.approx(np.mean(market * 0.5 + 0.1 - market))


def test_promotion_paired_test_against_the_incumbent() -> None:
    rng = np.random.default_rng(9)
    market = rng.standard_normal(80)
    incumbent = market + 0.6
    better = _promote(_series(incumbent + 0.3 + 0.3 * rng.standard_normal(80)), _series(incumbent))
    assert better.passed and better.values["incumbent_psr"] >= 0.9
    # Same P&L give or take noise: significant against flat, not against the incumbent.
    level = _promote(_series(incumbent + 0.3 * rng.standard_normal(80)), _series(incumbent))
    assert not level.passed and "not better than the incumbent" in level.message
    assert level.values["psr"] >= 0.95
    same = _promote(_series(incumbent), _series(incumbent))
    assert not same.passed and same.values["incumbent_psr"] == "nan"


def test_promotion_halt_kills_drawdown_and_misaligned_bars() -> None:
    good = _series(np.random.default_rng(10).standard_normal(80) + 1.0)
    halted = _promote(good, halted=True, kills_passed=False, max_drawdown=math.nan)
    assert not halted.passed
    # a halted run has no model to score: the halt is its one reason
    assert halted.message == "training halted" and halted.values["reasons"] == ["training halted"]
    killed = _promote(good, kills_passed=False, max_drawdown=math.nan)
    assert killed.values["reasons"][0] == "a kill criterion failed"
    assert killed.message.startswith("a kill criterion failed; max drawdown")
    assert halted.values["max_drawdown"] == "nan"
    assert "max drawdown 500.00 above 100.00" in _promote(good, max_drawdown=500.0).message
    # The incumbent recorded only every other bar: its buckets are summed from what it has.
    half = PnlSeries(good.pnl[::2], good.ts_ns[::2])
    event = _promote(good, half)
    assert event.values["n_buckets"] == 80
    with pytest.raises(ValueError, match="1-D of one length"):
        PnlSeries(np.zeros(3), np.zeros(4, dtype=np.int64))
