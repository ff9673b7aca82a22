"""Adam, weight decay, clipping, resuming, and a tiny network overfitting a fixed batch."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from agent.model import (
    Adam,
    ModelConfig,
    ModelError,
    NonFiniteError,
    backward,
    c51_loss_and_grad,
    c51_project,
    c51_support,
    clip_grad_norm,
    forward,
    init_params,
    return_loss_and_grad,
    to_numpy,
)


def test_first_adam_step_is_lr_times_the_gradient_sign(xp: ModuleType) -> None:
    params = {"w": xp.asarray([[1.0, -2.0]]), "b": xp.asarray([0.5])}
    grads = {"w": xp.asarray([[3.0, -0.25]]), "b": xp.asarray([1e3])}
    opt = Adam(params, lr=0.1, eps=1e-12)
    opt.update(params, grads)
    # m_hat = g, v_hat = g^2 after one step: the update is lr * g / |g|
    np.testing.assert_allclose(to_numpy(params["w"]), [[0.9, -1.9]], rtol=1e-9)
    np.testing.assert_allclose(to_numpy(params["b"]), [0.4], rtol=1e-9)
    assert opt.step == 1


def test_adam_second_step_matches_the_formula(xp: ModuleType) -> None:
    params = {"w": xp.asarray([1.0])}
    opt = Adam(params, lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    opt.update(params, {"w": xp.asarray([2.0])})
    opt.update(params, {"w": xp.asarray([-1.0])})
    m = 0.9 * (0.1 * 2.0) + 0.1 * -1.0
    v = 0.99 * (0.01 * 4.0) + 0.01 * 1.0
    first = 0.01 * 2.0 / (2.0 + 1e-8)  # m_hat = g, v_hat = g^2
    second = 0.01 * (m / (1 - 0.9**2)) / (np.sqrt(v / (1 - 0.99**2)) + 1e-8)
    np.testing.assert_allclose(to_numpy(params["w"]), [1.0 - first - second], rtol=1e-12)


def test_weight_decay_spares_vectors(xp: ModuleType) -> None:
    params = {"blocks.0.W_in": xp.ones((2, 2)), "blocks.0.A_log": xp.ones(2), "blocks.0.D": xp.ones(2)}
    zeros = {name: xp.zeros_like(p) for name, p in params.items()}
    Adam(params, lr=0.1, weight_decay=0.5).update(params, zeros)
    np.testing.assert_allclose(to_numpy(params["blocks.0.W_in"]), 0.95)
    np.testing.assert_array_equal(to_numpy(params["blocks.0.A_log"]), 1.0)
    np.testing.assert_array_equal(to_numpy(params["blocks.0.D"]), 1.0)


def test_adam_rejects_mismatched_gradients_and_bad_settings(xp: ModuleType) -> None:
    params = {"w": xp.ones(2)}
    with pytest.raises(ModelError, match="names differ"):
        Adam(params).update(params, {"v": xp.ones(2)})
    with pytest.raises(ModelError, match="lr"):
        Adam(params, lr=0.0)
    with pytest.raises(ModelError, match="betas"):
        Adam(params, betas=(1.0, 0.9))


def test_resumed_adam_continues_bit_for_bit(xp: ModuleType) -> None:
    rng = np.random.default_rng(0)
    params = {"w": xp.asarray(rng.standard_normal((3, 2))), "b": xp.asarray(rng.standard_normal(3))}
    steps = [{name: xp.asarray(rng.standard_normal(p.shape)) for name, p in params.items()} for _ in range(6)]
    opt = Adam(params, lr=0.05, weight_decay=0.01)
    for grads in steps[:3]:
        opt.update(params, grads)
    resumed_params = {name: p.copy() for name, p in params.items()}
    resumed = Adam.from_state(opt.state(), resumed_params)
    for grads in steps[3:]:
        opt.update(params, grads)
        resumed.update(resumed_params, grads)
    assert resumed.step == opt.step == 6
    for name, value in params.items():
        np.testing.assert_array_equal(to_numpy(resumed_params[name]), to_numpy(value))


def test_clip_grad_norm_scales_to_the_limit(xp: ModuleType) -> None:
    grads = {"a": xp.asarray([3.0, 0.0]), "b": xp.asarray([[4.0]])}
    assert clip_grad_norm(grads, 10.0) == pytest.approx(5.0)
    np.testing.assert_array_equal(to_numpy(grads["a"]), [3.0, 0.0])  # under the limit: untouched
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    norm = np.sqrt(sum(float((to_numpy(g) ** 2).sum()) for g in grads.values()))
    assert norm == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(to_numpy(grads["a"]), [0.6, 0.0], rtol=1e-5)


def test_clip_grad_norm_rejects_non_finite_gradients(xp: ModuleType) -> None:
    grads = {"a": xp.asarray([3.0, np.nan]), "b": xp.asarray([4.0])}
    with pytest.raises(NonFiniteError):
        clip_grad_norm(grads, 1.0)
    np.testing.assert_array_equal(to_numpy(grads["b"]), [4.0])
    with pytest.raises(ModelError, match="max_norm"):
        clip_grad_norm({"b": xp.asarray([4.0])}, 0.0)


def test_tiny_network_overfits_a_fixed_batch(xp: ModuleType) -> None:
    """Forward + backward + clipping + Adam drive the mixed loss down by more than 90%."""
    cfg = ModelConfig(
        n_features=4, window=8, d_model=16, n_layers=2, headdim=8, d_state=8, n_atoms=11, return_bins=7
    )
    rng = np.random.default_rng(1)
    params = init_params(cfg, rng, xp)
    batch = 8
    x = xp.asarray(rng.standard_normal((batch, cfg.window, cfg.n_features)).astype(np.float32))
    actions = xp.asarray(rng.integers(0, cfg.n_actions, batch))
    support = c51_support(cfg, xp)
    # done transitions with rewards on grid points: one-hot targets, so the loss can reach ~0
    rewards = xp.asarray(rng.choice(to_numpy(support), batch).astype(np.float32))
    target_m = c51_project(
        xp.full((batch, cfg.n_atoms), 1.0 / cfg.n_atoms, dtype=np.float32),
        rewards,
        xp.zeros(batch, dtype=np.float32),
        support,
    )
    bins = xp.asarray(rng.integers(0, cfg.return_bins, batch))
    opt = Adam(params, lr=1e-2, eps=1e-8)
    losses = []
    for _ in range(150):
        q, r, cache = forward(params, cfg, x)
        lq, gq = c51_loss_and_grad(q, actions, target_m)
        lr, gr = return_loss_and_grad(r, bins)
        losses.append(float(lq + lr))
        grads, _ = backward(params, cfg, cache, gq, gr)
        clip_grad_norm(grads, 10.0)
        opt.update(params, grads)
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.1 * losses[0], f"loss went from {losses[0]:.3f} to {losses[-1]:.3f}"
