"""n-step returns, the replay ring, and the gates' decisions (hand-computed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.train.config import TrainConfig
from agent.train.gates import action_entropy, kill_criteria, promotion, q_drift
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


CFG = TrainConfig(drift_ratio=2.0, drift_abs=1.5)


@pytest.mark.parametrize(
    ("q", "q_prev", "passed"),
    [
        (1.0, 0.1, True),
        (1.6, 0.9, True),
        (1.6, 0.5, False),
        (-3.0, 1.0, False),
        (math.nan, 1.0, False),
        (1.0, math.inf, False),
    ],
)
def test_q_drift_needs_both_growth_and_size(q: float, q_prev: float, passed: bool) -> None:
    event = q_drift(q, q_prev, CFG, fold_index=1, epoch=3)
    assert event.passed is passed and event.fold_index == 1 and event.epoch == 3
    assert event.values["drift_abs"] == 1.5


def test_kill_criteria_and_promotion() -> None:
    cfg = TrainConfig(
        min_q_spread=0.01, min_action_entropy=0.1, min_return_vs_random=0.0, min_early_q_move=0.01
    )
    assert action_entropy([1.0, 0.0, 0.0]) == 0.0
    assert action_entropy([0.5, 0.5, 0.0]) == pytest.approx(math.log(2))
    kills = kill_criteria(q_spread=0.5, entropy=0.0, pnl=10.0, random_pnl=-5.0, early_q_move=0.2, config=cfg)
    assert {k.kind: k.passed for k in kills} == {
        "kill_q_spread": True,
        "kill_action_entropy": False,
        "kill_return_vs_random": True,
        "kill_early_q_move": True,
    }
    assert kills[2].values == {"value": 15.0, "threshold": 0.0, "pnl": 10.0, "random_pnl": -5.0}
    cfg = TrainConfig(promotion_margin=0.2, max_drawdown=100.0)
    ok = promotion(
        halted=False, kills_passed=True, sharpe=1.0, incumbent_sharpe=0.7, max_drawdown=50.0, config=cfg
    )
    assert ok.passed
    close = promotion(
        halted=False, kills_passed=True, sharpe=0.85, incumbent_sharpe=0.7, max_drawdown=50.0, config=cfg
    )
    assert not close.passed and "not above 0.900" in close.message
    assert not promotion(
        halted=False, kills_passed=True, sharpe=-0.5, incumbent_sharpe=-2.0, max_drawdown=1.0, config=cfg
    ).passed  # never below zero, whatever the incumbent
    deep = promotion(
        halted=False, kills_passed=True, sharpe=2.0, incumbent_sharpe=None, max_drawdown=500.0, config=cfg
    )
    assert not deep.passed and "drawdown" in deep.message
    halted = promotion(
        halted=True,
        kills_passed=False,
        sharpe=math.nan,
        incumbent_sharpe=None,
        max_drawdown=math.nan,
        config=cfg,
    )
    assert not halted.passed and halted.values["sharpe"] == "nan"
