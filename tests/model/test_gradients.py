"""Backward pass vs central finite differences, float64, every parameter entry and the input."""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import numpy as np
import pytest

from agent.model import (
    Array,
    Params,
    backward,
    c51_loss_and_grad,
    c51_project,
    c51_support,
    expected_q,
    forward,
    init_params,
    q_probs,
    return_loss_and_grad,
    to_numpy,
)
from agent.model.losses import munchausen_project
from tests.model.conftest import TINY

EPS = 1e-6
TOLERANCE = 1e-5


class Batch(NamedTuple):
    x: Array  # (B, K, F)
    actions: Array  # (B,), every action at least once
    target_m: Array  # (B, atoms), projected C51 targets
    bins: Array  # (B,), return-head labels


def _problem(xp: ModuleType) -> tuple[Params, Batch]:
    rng = np.random.default_rng(7)
    params = init_params(TINY, rng, xp, dtype=np.float64)
    for name, value in params.items():  # move away from the symmetric init (norms = 1, D = 1)
        params[name] = value + xp.asarray(0.2 * rng.standard_normal(value.shape))
    for i in range(TINY.n_layers):  # larger steps so the SSM decays matter inside K = 5 bars
        params[f"blocks.{i}.dt_bias"] += 1.0
    batch = 4
    support = c51_support(TINY, xp, np.float64)
    next_probs = q_probs(xp.asarray(rng.standard_normal((batch, TINY.n_atoms))))
    rewards, discounts = xp.asarray([0.3, -1.1, 0.0, 5.0]), xp.asarray([0.9, 0.0, 0.99, 0.5])
    return params, Batch(
        x=xp.asarray(rng.standard_normal((batch, TINY.window, TINY.n_features))),
        actions=xp.asarray([0, 1, 2, 1]),
        target_m=c51_project(next_probs, rewards, discounts, support),
        bins=xp.asarray([0, 2, 4, 1]),
    )


def _loss(params: Params, batch: Batch, chunk: int) -> float:
    """The mixed loss: C51 cross-entropy + 0.7 x return-head cross-entropy."""
    q, r, _ = forward(params, TINY, batch.x, chunk)
    c51 = c51_loss_and_grad(q, batch.actions, batch.target_m)[0]
    return float(c51 + 0.7 * return_loss_and_grad(r, batch.bins)[0])


def _grads(params: Params, batch: Batch, chunk: int) -> tuple[Params, Array]:
    q, r, cache = forward(params, TINY, batch.x, chunk)
    gq = c51_loss_and_grad(q, batch.actions, batch.target_m)[1]
    gr = return_loss_and_grad(r, batch.bins)[1]
    return backward(params, TINY, cache, gq, 0.7 * gr)


@pytest.mark.parametrize("chunk", [TINY.window, 2], ids=["one-chunk", "ragged-chunks"])
def test_every_gradient_matches_finite_differences(xp: ModuleType, chunk: int) -> None:
    params, batch = _problem(xp)
    grads, gx = _grads(params, batch, chunk)
    assert set(grads) == set(params)
    tensors = {**params, "input": batch.x}
    analytic = {**grads, "input": gx}
    for name, array in tensors.items():
        assert analytic[name].shape == array.shape, name
        flat = array.reshape(-1)  # a view: writing into it perturbs the tensor in place
        numeric = np.zeros(flat.size)
        for i in range(flat.size):
            old = float(flat[i])
            flat[i] = old + EPS
            plus = _loss(params, batch, chunk)
            flat[i] = old - EPS
            minus = _loss(params, batch, chunk)
            flat[i] = old
            numeric[i] = (plus - minus) / (2 * EPS)
        exact = to_numpy(analytic[name]).reshape(-1)
        scale = np.abs(numeric).max()
        assert scale > 1e-8, f"{name}: the loss does not reach this tensor"
        error = np.abs(exact - numeric).max() / scale
        assert error < TOLERANCE, f"{name}: relative error {error:.2e}"


def test_gradients_do_not_depend_on_the_chunk_length(xp: ModuleType) -> None:
    params, batch = _problem(xp)
    reference, g_ref = _grads(params, batch, TINY.window)
    for chunk in (1, 3, 4):
        grads, gx = _grads(params, batch, chunk)
        np.testing.assert_allclose(to_numpy(gx), to_numpy(g_ref), rtol=1e-10, atol=1e-12)
        for name, value in grads.items():
            np.testing.assert_allclose(to_numpy(value), to_numpy(reference[name]), rtol=1e-10, atol=1e-12)


def test_munchausen_loss_gradient_matches_finite_differences(xp: ModuleType) -> None:
    """The learner's gradient under a Munchausen target (a constant of the target network: the
    pi(.|s')-mixture with the bonus) against central differences of its loss."""
    params, batch = _problem(xp)
    rng = np.random.default_rng(8)
    target = {
        name: value + xp.asarray(0.05 * rng.standard_normal(value.shape)) for name, value in params.items()
    }
    support = c51_support(TINY, xp, np.float64)
    x_next = xp.asarray(rng.standard_normal(batch.x.shape))
    next_probs = q_probs(forward(target, TINY, x_next)[0])
    m = munchausen_project(
        next_probs,
        expected_q(next_probs, support),
        expected_q(q_probs(forward(target, TINY, batch.x)[0]), support),
        actions=batch.actions,
        rewards=xp.asarray([0.3, -1.1, 0.0, 5.0]),
        discounts=xp.asarray([0.9, 0.0, 0.99, 0.5]),
        support=support,
        alpha=0.9,
        tau=0.03,
        clip_low=-1.0,
    )
    np.testing.assert_allclose(to_numpy(m.sum(axis=1)), 1.0, atol=1e-12)
    munch = batch._replace(target_m=m)
    grads, _ = _grads(params, munch, TINY.window)
    for name in ("q.W", "blocks.0.W_in", "blocks.0.A_log", "embed.W"):
        flat = params[name].reshape(-1)
        picks = np.linspace(0, flat.size - 1, 12).astype(int)
        numeric = np.zeros(picks.size)
        for k, i in enumerate(picks):
            old = float(flat[i])
            flat[i] = old + EPS
            plus = _loss(params, munch, TINY.window)
            flat[i] = old - EPS
            minus = _loss(params, munch, TINY.window)
            flat[i] = old
            numeric[k] = (plus - minus) / (2 * EPS)
        exact = to_numpy(grads[name]).reshape(-1)[picks]
        scale = np.abs(numeric).max()
        assert scale > 1e-8, name
        assert np.abs(exact - numeric).max() / scale < TOLERANCE, name
