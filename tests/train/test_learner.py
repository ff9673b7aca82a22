"""The learner and the fold loop: determinism per seed, target-network modes, the report."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import msgspec
import numpy as np
import pytest

from agent.kernels.train import UpdateSettings, update_ref
from agent.model import ModelConfig, init_params
from agent.policy.observation import AGENT_FEATURES
from agent.reports.training import render_report
from agent.train.config import TrainConfig
from agent.train.env import EnvData, build_env_data, fit_norm
from agent.train.learner import Learner
from agent.train.replay import Transitions
from agent.train.summary import Curves, RunResult, TrainSummary
from agent.train.trainer import EpochRecord, train_fold
from feeds.features import FEATURE_NAMES
from tests.train.test_env import make_bars

MODEL = ModelConfig(
    window=4,
    d_model=8,
    n_layers=1,
    headdim=4,
    d_state=4,
    n_atoms=11,
    v_min=-3.0,
    v_max=3.0,
    return_bins=5,
    return_max_ticks=2.0,
).with_features(len(FEATURE_NAMES) + len(AGENT_FEATURES))
TRAIN = TrainConfig(
    epochs=2,
    steps_per_epoch=30,
    n_envs=8,
    batch_size=16,
    learning_starts=32,
    replay_capacity=500,
    probe_size=16,
    lr=1e-3,
)


def _data() -> EnvData:
    rng = np.random.default_rng(5)
    bars = make_bars(list(1000 + np.cumsum(rng.integers(-1, 2, 400))))
    parts = [(bars, 0, len(bars))]
    return build_env_data(parts, fit_norm(parts), window=MODEL.window, horizon=1, session_gap_s=600, xp=np)


def _train(seed: int, config: TrainConfig = TRAIN) -> tuple[Learner, list[float]]:
    learner = Learner(MODEL, config, init_params(MODEL, np.random.default_rng(seed)), seed=seed)
    result = train_fold(learner, _data(), config, fold=0, seed=seed)
    return learner, [e.q_mean for e in result.epochs]


def test_training_is_deterministic_per_seed_on_the_cpu() -> None:
    a, qa = _train(3)
    b, qb = _train(3)
    c, _ = _train(4)
    assert a.updates == b.updates > 0 and qa == qb
    for name, p in a.params.items():
        np.testing.assert_array_equal(p, b.params[name])
    assert any(not np.array_equal(p, c.params[name]) for name, p in a.params.items())


@pytest.mark.parametrize("mode", ["polyak", "hard", "none"])
def test_target_network_modes(mode: str) -> None:
    config = msgspec.structs.replace(TRAIN, target_update=mode, hard_sync_every=5)
    learner, _ = _train(1, config)
    online, target = learner.params, learner.target
    if mode == "none":
        assert target is online
        return
    assert target is not online
    moved = [not np.array_equal(online[k], target[k]) for k in online]
    if mode == "hard" and learner.updates % 5 == 0:
        assert not any(moved)
    else:
        assert any(moved)
    if mode == "polyak":  # a slow average: closer to where it started than the online weights are
        start = init_params(MODEL, np.random.default_rng(1))
        k = "q.W"
        assert np.abs(target[k] - start[k]).sum() < np.abs(online[k] - start[k]).sum()


def test_report_is_self_contained_html_with_well_formed_svg() -> None:
    epochs = [
        EpochRecord(
            fold=0,
            epoch=i,
            q_mean=0.1 * i,
            q_spread=0.2,
            entropy=0.5,
            c51_loss=2.0 - 0.1 * i,
            return_loss=1.0,
            grad_norm=1.0,
            reward_mean=-0.1,
            explore_mix=[0.3, 0.4, 0.3],
            updates=10 * i,
        )
        for i in range(3)
    ]
    html = render_report(RunResult(TrainSummary(epochs=epochs, drift_abs=1.5, drift_ratio=2.0), Curves()))
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    svgs = html.split("<svg")[1:]
    assert len(svgs) == 6
    for chunk in svgs:
        ET.fromstring("<svg" + chunk[: chunk.index("</svg>") + 6].replace("&middot;", "."))
    assert "Q-drift threshold" in html and "polyline" in html


def test_a_munchausen_update_is_the_reference_update() -> None:
    """One Learner.update with Munchausen targets against agent.kernels.train.update_ref (the
    chain the fused kernels are held to), from the same parameters, batch and target network."""
    config = msgspec.structs.replace(TRAIN, munchausen=True, munchausen_tau=0.3, grad_clip=1e9)
    data = _data()
    params = init_params(MODEL, np.random.default_rng(9))
    learner = Learner(MODEL, config, {k: v.copy() for k, v in params.items()}, seed=9)
    rng = np.random.default_rng(10)
    for k in learner.target:  # a target distinct from the online network
        learner.target[k] += np.float32(0.05) * rng.standard_normal(learner.target[k].shape).astype(
            np.float32
        )
    target = {k: v.copy() for k, v in learner.target.items()}
    starts = np.asarray(data.starts)
    t = rng.choice(starts[:-5], 8)
    agent = rng.normal(size=(8, MODEL.window, 2)).astype(np.float32)
    batch = Transitions(
        t=t,
        agent=agent,
        action=np.array([0, 1, 2, 0, 1, 2, 0, 1]),
        reward=rng.normal(size=8).astype(np.float32),
        discount=np.array([0.729, 0.0] * 4, dtype=np.float32),
        t_next=t + 1,
        agent_next=agent,
    )
    stats = learner.update(data, batch)
    settings = UpdateSettings(
        lr=config.lr,
        eps=config.adam_eps,
        max_norm=config.grad_clip,
        target_mode=1,
        rho=config.polyak_rho,
        hard_every=config.hard_sync_every,
        ret_weight=config.return_loss_weight,
        munchausen=True,
        m_alpha=config.munchausen_alpha,
        m_tau=config.munchausen_tau,
        m_clip=config.munchausen_clip,
    )
    inputs = {
        "t_obs": t,
        "agent_obs": agent,
        "t_next": t + 1,
        "agent_next": agent,
        "action": batch.action,
        "reward": batch.reward,
        "discount": batch.discount,
        "label": np.asarray(data.label_ticks)[t],
    }
    new, new_target, _, _, ref = update_ref(
        params, target, MODEL, settings=settings, feat=np.asarray(data.feat), inputs=inputs
    )
    np.testing.assert_allclose(stats.c51_loss, ref["c51_loss"], rtol=1e-4)
    assert new_target is not None
    for name, value in new.items():
        np.testing.assert_allclose(learner.params[name], value, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(learner.target[name], new_target[name], atol=2e-6, err_msg=name)
