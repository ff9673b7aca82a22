"""The trainer's kernels on a CUDA device: parity with the NumPy chain and with the array-code
learner, and a CUDA graph replayed like the trainer replays it.

The same comparisons as tests/kernels/test_train_emulated.py (the CPU emulation), on the device:
one fused update against :func:`agent.kernels.train.update_ref` (gradients to 1e-5 of their
scale, parameters to 2e-6), then :class:`agent.train.cuda_learner.CudaLearner` against
:class:`agent.train.learner.Learner` on the same environment, replay and batches for a few
hundred updates (parameters to 1e-3 of their scale: float32 on both sides, different summation
orders), with exploration actions equal where the two distributions agree.
"""

from __future__ import annotations

from types import ModuleType

import msgspec
import numpy as np
import pytest

from agent.kernels.loader import kernel
from agent.kernels.mamba_forward import pack_params
from agent.kernels.train import FusedUpdate, train_layout, unpack_params, update_ref
from agent.model.config import ModelConfig
from agent.model.params import init_params
from agent.train.config import TrainConfig
from agent.train.cuda_learner import CudaLearner
from agent.train.env import VecEnv, build_env_data, fit_norm
from agent.train.learner import Learner
from agent.train.replay import NStepBuffer, Replay
from tests.kernels.test_train_emulated import MEDIUM, SMALL, make_case, settings_for
from tests.train.test_env import make_bars

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("cfg", "mode", "munchausen"),
    [(SMALL, 1, False), (MEDIUM, 2, False), (ModelConfig(n_features=32), 1, False), (MEDIUM, 1, True)],
    ids=["small-polyak", "medium-hard", "default-polyak", "medium-munchausen"],
)
def test_fused_update_on_the_device_matches_the_chain(
    cp: ModuleType, cfg: ModelConfig, mode: int, munchausen: bool
) -> None:
    case = make_case(cfg, batch=16, seed=3)
    settings = settings_for(mode, munchausen)
    layout = train_layout(cfg)

    def get(name: str) -> object:
        return kernel("train.cu", name, options=layout.options)

    update = FusedUpdate(
        cfg,
        settings,
        xp=cp,
        get=get,
        packed=pack_params(case["params"], cfg, np.zeros(cfg.n_features), np.ones(cfg.n_features)),
        inputs={k: cp.asarray(v) for k, v in case["inputs"].items()},
        ring_size=4,
    )
    update.target[...] = cp.asarray(
        pack_params(case["target"], cfg, np.zeros(cfg.n_features), np.ones(cfg.n_features))
    )
    update.feat = cp.asarray(case["feat"])
    update.enqueue()
    new, new_target, _, grads, _ = update_ref(
        case["params"], case["target"], cfg, settings=settings, feat=case["feat"], inputs=case["inputs"]
    )
    f = cfg.n_features
    want = pack_params(grads, cfg, np.zeros(f), np.zeros(f))
    got = cp.asnumpy(update.grad)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()
    params = unpack_params(cp.asnumpy(update.params), cfg)
    for name, value in new.items():
        np.testing.assert_allclose(params[name], value, atol=2e-6, rtol=0, err_msg=name)
    assert new_target is not None
    target = unpack_params(cp.asnumpy(update.target), cfg)
    for name, value in new_target.items():
        np.testing.assert_allclose(target[name], value, atol=2e-6, rtol=0, err_msg=name)


def test_cuda_learner_follows_the_array_learner(cp: ModuleType) -> None:
    cfg = MEDIUM
    train = TrainConfig(n_envs=16, batch_size=32, learning_starts=64, steps_per_epoch=50, lr=1e-3)
    bars = make_bars((1000.0 + np.cumsum(np.random.default_rng(4).normal(size=2000))).tolist())
    parts = [(bars, 0, len(bars))]
    data = build_env_data(
        parts, fit_norm(parts), window=cfg.window, horizon=cfg.return_horizon, session_gap_s=600.0, xp=np
    )
    model = msgspec.structs.replace(cfg, n_features=data.n_market + 2)
    params = init_params(model, np.random.default_rng(1))
    fused = CudaLearner(model, train, {k: v.copy() for k, v in params.items()}, seed=7)
    plain = Learner(model, train, {k: v.copy() for k, v in params.items()}, seed=7)
    env = VecEnv(data, train.n_envs, reward_scale=train.reward_scale, seed=2)
    env.reset_random()
    nstep = NStepBuffer(train.n_step, train.gamma, n_envs=train.n_envs, window=cfg.window, n_agent=2, xp=np)
    replay = Replay(4096, cfg.window, 2, np)
    rng = np.random.default_rng(5)
    ids = np.arange(train.n_envs)
    agree = total = 0
    for step in range(200):
        counter = np.full(train.n_envs, step, dtype=np.int64)
        a_fused = fused.explore(data, env.t, env.agent, ids, counter)
        a_plain = plain.explore(data, env.t, env.agent, ids, counter)
        agree += int((a_fused == a_plain).sum())
        total += a_fused.size
        before = (env.t.copy(), env.agent.copy())
        res = env.step(a_plain)
        batch = nstep.push(before, res.action, res.reward, res.done, (env.t.copy(), env.agent.copy()))
        if batch is not None:
            replay.add(batch)
        env.reset_random(res.done)
        if replay.size >= train.learning_starts:
            sample = replay.sample(rng, train.batch_size)
            fused.update(data, sample)
            plain.update(data, sample)
    got, want = fused.take_stats(), plain.take_stats()
    assert got.updates == want.updates > 100 and got.skipped == want.skipped == 0
    np.testing.assert_allclose(got.c51_loss, want.c51_loss, rtol=1e-3)
    np.testing.assert_allclose(got.grad_norm, want.grad_norm, rtol=1e-3)
    host = fused.host_params()
    for name, value in plain.params.items():
        scale = max(float(np.abs(value).max()), 1e-3)
        assert np.abs(host[name] - value).max() < 1e-3 * scale, name
    assert agree / total > 0.97  # Thompson draws agree unless a uniform lands on a CDF step
    obs = data.windows(env.t, env.agent)
    np.testing.assert_allclose(cp.asnumpy(fused.q_values(obs)), plain.q_values(obs), rtol=1e-3, atol=1e-3)
