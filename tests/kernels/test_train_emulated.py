"""The trainer's kernels (agent/kernels/train.cu) against their reference, on the CPU emulation.

One fused update (next-state logits, the backward pass, the reduction, Adam with the target
sync, the counters and the stats record) against :func:`agent.kernels.train.update_ref`, the
NumPy chain of ``Learner.update`` in float64: gradients to 1e-5 of their scale, parameters
after Adam to 1e-6 absolute. The acting kernel against the model's forward and the Thompson
reference. tests/gpu/test_train_kernels.py runs the same comparisons on a device.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import msgspec
import numpy as np
import pytest

from agent.kernels.mamba_forward import pack_params
from agent.kernels.train import (
    COUNTERS,
    INPUTS,
    STATS_DTYPE,
    FusedUpdate,
    TrainLayout,
    UpdateSettings,
    input_shape,
    pack_train,
    train_layout,
    unpack_params,
    update_ref,
)
from agent.model import forward
from agent.model.config import ModelConfig
from agent.model.heads import c51_support, q_probs
from agent.model.params import init_params
from agent.policy.philox import Purpose
from agent.policy.thompson import thompson_ref

SMALL = ModelConfig(
    n_features=6,
    window=8,
    d_model=16,
    n_layers=2,
    headdim=8,
    d_state=4,
    ngroups=2,
    return_bins=9,
    v_min=-5.0,
    v_max=5.0,
)
"""Every structural feature (two groups, K > conv width) at a size the emulation runs fast."""
MEDIUM = ModelConfig(n_features=12, window=16, d_model=32, n_layers=2)
LONG = ModelConfig(n_features=5, window=40, d_model=16, n_layers=1, headdim=8, d_state=4, return_bins=7)
"""A window longer than a warp: the scans run in passes of 32 steps."""


def make_case(cfg: ModelConfig, batch: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    params = init_params(cfg, rng)
    for name in ("q.W", "q.b", "ret.W", "ret.b"):
        params[name] = params[name] * np.float32(3.0)
    target = {
        k: v + np.float32(0.05) * rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()
    }
    rows = 6 * cfg.window
    feat = rng.normal(size=(rows, cfg.n_features - 2)).astype(np.float32)
    inputs = {name: np.zeros(input_shape(name, batch, cfg), dtype=dt) for name, (_, dt) in INPUTS.items()}
    inputs["t_obs"][:] = rng.integers(cfg.window - 1, rows - 2, batch)
    inputs["t_next"][:] = inputs["t_obs"] + rng.integers(1, 3, batch)
    inputs["agent_obs"][:] = rng.normal(size=inputs["agent_obs"].shape)
    inputs["agent_next"][:] = rng.normal(size=inputs["agent_next"].shape)
    inputs["action"][:] = rng.integers(0, cfg.n_actions, batch)
    inputs["reward"][:] = rng.normal(size=batch) * 2.0
    inputs["discount"][:] = rng.choice([0.0, 0.9**3], batch)
    inputs["label"][:] = rng.normal(size=batch) * 4.0
    inputs["label"][1] = np.nan  # no label: no return-head gradient
    inputs["label"][2] = 1e6  # beyond the outer bin
    return {"params": params, "target": target, "feat": feat, "inputs": inputs}


def fused(
    emu: ModuleType,
    cfg: ModelConfig,
    settings: UpdateSettings,
    case: dict[str, Any],
    layout: TrainLayout | None = None,
) -> FusedUpdate:
    layout = layout or train_layout(cfg)
    module = emu.module("train.cu", layout.options)
    update = FusedUpdate(
        cfg,
        settings,
        xp=np,
        get=module.get_function,
        packed=pack_train(case["params"], cfg),
        inputs=case["inputs"],
        ring_size=4,
        layout=layout,
    )
    if update.target is not update.params:
        update.target[...] = pack_train(case["target"], cfg)
    update.feat = case["feat"]
    return update


def settings_for(mode: int, munchausen: bool = False) -> UpdateSettings:
    return UpdateSettings(
        lr=1e-3,
        eps=3.125e-4,
        max_norm=0.5,
        target_mode=mode,
        rho=0.01,
        hard_every=1,
        ret_weight=0.7,
        munchausen=munchausen,
        m_tau=0.3,  # a temperature at which pi mixes the actions (0.03 makes it nearly greedy)
    )


def assert_close_params(got: dict[str, Any], want: dict[str, Any], atol: float) -> None:
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=atol, rtol=0, err_msg=name)


@pytest.mark.parametrize(
    ("cfg", "mode", "munchausen"),
    [
        (SMALL, 1, False),
        (SMALL, 0, False),
        (MEDIUM, 2, False),
        (LONG, 1, False),
        (SMALL, 1, True),
        (MEDIUM, 0, True),
        (ModelConfig(n_features=32), 1, False),
        (msgspec.structs.replace(SMALL, window=7), 1, False),
    ],
    ids=[
        "small-polyak",
        "small-none",
        "medium-hard",
        "long-window",
        "small-munchausen",
        "medium-munchausen-none",
        "default-polyak",
        "odd-window",
    ],
)
def test_one_fused_update_matches_the_learners_chain(
    emu: ModuleType, cfg: ModelConfig, mode: int, munchausen: bool
) -> None:
    case = make_case(cfg, batch=5, seed=3)
    settings = settings_for(mode, munchausen)
    update = fused(emu, cfg, settings, case)
    update.enqueue()
    target = None if mode == 0 else case["target"]
    new, new_target, _, grads, stats = update_ref(
        case["params"], target, cfg, settings=settings, feat=case["feat"], inputs=case["inputs"]
    )
    f = cfg.n_features
    want_grad = pack_params(grads, cfg, np.zeros(f), np.zeros(f))
    scale = np.abs(want_grad).max()
    assert np.abs(update.grad - want_grad).max() < 1e-5 * scale
    assert_close_params(unpack_params(update.params, cfg), new, atol=2e-6)
    if new_target is not None:
        assert_close_params(unpack_params(update.target, cfg), new_target, atol=2e-6)
    record = update.ring.view(STATS_DTYPE).reshape(-1)[0]
    assert record["skipped"] == 0
    np.testing.assert_allclose(record["c51_loss"], stats["c51_loss"], rtol=1e-5)
    np.testing.assert_allclose(record["ret_loss"], stats["ret_loss"], rtol=1e-5)
    np.testing.assert_allclose(record["grad_norm"], stats["grad_norm"], rtol=1e-5)
    assert stats["grad_norm"] > settings.max_norm  # the case exercises the clip
    assert dict(zip(COUNTERS, update.counters.tolist(), strict=True)) == {
        "adam_step": 1,
        "updates": 1,
        "skipped": 0,
        "ring": 1,
    }


def test_updates_continue_adam_the_target_and_the_ring(emu: ModuleType) -> None:
    cfg = SMALL
    case = make_case(cfg, batch=4, seed=5)
    settings = settings_for(1)
    update = fused(emu, cfg, settings, case)
    params, target, adam = case["params"], case["target"], None
    losses = []
    for k in range(3):  # the same batch three times, from the moved parameters and moments
        update.enqueue()
        params, target, adam, _, stats = update_ref(
            params,
            target,
            cfg,
            settings=settings,
            feat=case["feat"],
            inputs=case["inputs"],
            adam=adam,
            updates=k,
        )
        losses.append(stats["c51_loss"])
    assert_close_params(unpack_params(update.params, cfg), params, atol=1e-5)
    assert target is not None
    assert_close_params(unpack_params(update.target, cfg), target, atol=1e-5)
    records = update.ring.view(STATS_DTYPE).reshape(-1)
    np.testing.assert_allclose(records["c51_loss"][:3], losses, rtol=1e-4)
    assert update.counters.tolist() == [3, 3, 0, 3]
    assert losses[2] < losses[0]  # three steps on one batch lower its loss


def test_a_non_finite_gradient_skips_the_update_and_counts_it(emu: ModuleType) -> None:
    cfg = SMALL
    case = make_case(cfg, batch=4, seed=7)
    case["feat"][case["inputs"]["t_obs"][0]] = np.nan  # a poisoned observation
    update = fused(emu, cfg, settings_for(1), case)
    before = update.params.copy()
    target_before = update.target.copy()
    update.enqueue()
    np.testing.assert_array_equal(update.params, before)
    np.testing.assert_array_equal(update.target, target_before)
    assert update.counters.tolist() == [0, 0, 1, 1]
    record = update.ring.view(STATS_DTYPE).reshape(-1)[0]
    assert record["skipped"] == 1 and not np.isfinite(record["grad_norm"])


def test_act_kernel_matches_forward_and_thompson(emu: ModuleType) -> None:
    cfg = MEDIUM
    case = make_case(cfg, batch=3, seed=9)
    update = fused(emu, cfg, settings_for(1), case)
    rng = np.random.default_rng(11)
    envs = 6
    t = rng.integers(cfg.window - 1, case["feat"].shape[0], envs).astype(np.int64)
    agent = rng.normal(size=(envs, cfg.window, 2)).astype(np.float32)
    step = rng.integers(0, 2**40, envs).astype(np.uint64)
    support = c51_support(cfg)
    idx = t[:, None] + np.arange(1 - cfg.window, 1)[None, :]
    obs = np.concatenate([case["feat"][idx], agent], axis=2).astype(np.float64)
    p64 = {k: v.astype(np.float64) for k, v in case["params"].items()}
    probs = q_probs(forward(p64, cfg, obs)[0])
    for greedy in (False, True):
        action = np.full(envs, -1, dtype=np.int32)
        q = np.full((envs, cfg.n_actions), np.nan, dtype=np.float32)
        update.act(t, agent, step, seed=17, purpose=int(Purpose.THOMPSON), greedy=greedy, action=action, q=q)
        want_q = (probs * support).sum(axis=2)
        np.testing.assert_allclose(q, want_q, rtol=1e-4, atol=1e-5)
        if greedy:
            np.testing.assert_array_equal(action, np.argmax(q, axis=1))
        else:
            draw = thompson_ref(probs.astype(np.float32), support, 17, np.arange(envs), step)
            np.testing.assert_array_equal(action, draw.action)
