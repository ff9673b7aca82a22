"""C51 projection, the two cross-entropies and the return-head labels."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from agent.model import (
    ModelConfig,
    ModelError,
    c51_loss_and_grad,
    c51_project,
    c51_support,
    q_probs,
    return_bin_centres,
    return_bin_of,
    return_loss_and_grad,
    return_moments,
    to_numpy,
)
from agent.model.losses import c51_project_ref, munchausen_project
from agent.model.ops import log_softmax

CFG = ModelConfig()  # 51 atoms on [-10, 10], dz = 0.4


def _project_both(
    xp: ModuleType, probs: np.ndarray, rewards: list[float], discounts: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """(O(N) projection, O(N^2) kernel-form projection) of the same transitions, on the host."""
    r = xp.asarray(rewards, dtype=np.float64)
    d = xp.asarray(discounts, dtype=np.float64)
    support = c51_support(CFG, xp, np.float64)
    m = c51_project(xp.asarray(probs), r, d, support)
    return to_numpy(m), to_numpy(c51_project_ref(xp.asarray(probs), r, d, support))


EDGE_CASES = {
    # name: (rewards, discounts); discounts = gamma^n * (1 - done)
    "done, reward on a grid point": ([0.4, -10.0, 10.0, 0.0], [0.0, 0.0, 0.0, 0.0]),
    "done, reward off the grid": ([0.123, -3.33, 9.99, -0.2], [0.0] * 4),
    "reward beyond the support": ([25.0, -25.0, 10.0001, -1e9], [0.99, 0.99, 0.0, 0.5]),
    "gamma 0 (not done)": ([1.0, 2.2, -7.3, 0.0], [0.0] * 4),
    "gamma 1": ([0.0, 0.4, -0.2, 3.0], [1.0] * 4),
    "gamma 1, shifts off the grid": ([0.1, -0.13, 1e-9, -1e-9], [1.0] * 4),
    "gamma^n": ([0.5, -0.5, 1.7, 0.0], [0.99**3, 0.99**3, 0.9, 0.95]),
}


@pytest.mark.parametrize("case", list(EDGE_CASES), ids=list(EDGE_CASES))
def test_projection_conserves_mass_and_matches_the_kernel_form(xp: ModuleType, case: str) -> None:
    rewards, discounts = EDGE_CASES[case]
    rng = np.random.default_rng(0)
    probs = np.asarray(to_numpy(q_probs(xp.asarray(rng.standard_normal((len(rewards), CFG.n_atoms))))))
    probs[0] = 0.0  # a point mass on one atom (integer positions for every atom at gamma 1)
    probs[0, 17] = 1.0
    m, m_ref = _project_both(xp, probs, rewards, discounts)
    assert (m >= 0).all()
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(m, m_ref, atol=1e-12)


def test_projection_on_random_transitions_matches_the_kernel_form(xp: ModuleType) -> None:
    rng = np.random.default_rng(1)
    batch = 256
    probs = to_numpy(q_probs(xp.asarray(rng.standard_normal((batch, CFG.n_atoms)))))
    rewards = rng.normal(0.0, 4.0, batch)
    discounts = rng.choice([0.0, 0.9, 0.99, 1.0], batch) * rng.integers(0, 2, batch)
    m, m_ref = _project_both(xp, probs, list(rewards), list(discounts))
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(m, m_ref, atol=1e-12)


def test_projection_of_known_targets(xp: ModuleType) -> None:
    probs = np.full((3, CFG.n_atoms), 1.0 / CFG.n_atoms)
    m, _ = _project_both(xp, probs, [0.4, 30.0, 0.2], [0.0, 0.9, 0.0])
    assert m[0, 26] == pytest.approx(1.0)  # done, r = 0.4 = z_26: all mass on that atom
    assert m[1, 50] == pytest.approx(1.0)  # beyond v_max: all mass on the last atom
    np.testing.assert_allclose(m[2, 25:27], [0.5, 0.5])  # halfway between z_25 = 0 and z_26 = 0.4


def test_projection_float32_keeps_mass(xp: ModuleType) -> None:
    support = c51_support(CFG, xp, np.float32)
    rng = np.random.default_rng(2)
    probs = q_probs(xp.asarray(rng.standard_normal((64, CFG.n_atoms)).astype(np.float32)))
    rewards = xp.asarray(rng.choice([-10.0, -0.4, 0.0, 0.4, 10.0, 12.3], 64).astype(np.float32))
    discounts = xp.asarray(rng.choice([0.0, 0.99, 1.0], 64).astype(np.float32))
    m = c51_project(probs, rewards, discounts, support)
    assert m.dtype == np.float32
    np.testing.assert_allclose(to_numpy(m).sum(axis=1), 1.0, atol=1e-5)


def test_c51_loss_is_the_taken_actions_cross_entropy_and_its_gradient(xp: ModuleType) -> None:
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 3, 7))
    target = to_numpy(q_probs(xp.asarray(rng.standard_normal((4, 7)))))
    actions = np.array([2, 0, 0, 1])
    loss, grad = c51_loss_and_grad(xp.asarray(logits), xp.asarray(actions), xp.asarray(target))
    rows = np.arange(4)
    expected = -(target * to_numpy(log_softmax(xp.asarray(logits[rows, actions])))).sum(axis=1).mean()
    assert float(loss) == pytest.approx(expected, rel=1e-12)
    grad = to_numpy(grad)
    untaken = np.ones((4, 3), dtype=bool)
    untaken[rows, actions] = False
    assert (grad[untaken] == 0).all()
    numeric = np.zeros_like(logits)
    for index in np.ndindex(*logits.shape):
        bumped = logits.copy()
        bumped[index] += 1e-6
        plus = float(c51_loss_and_grad(xp.asarray(bumped), xp.asarray(actions), xp.asarray(target))[0])
        bumped[index] -= 2e-6
        minus = float(c51_loss_and_grad(xp.asarray(bumped), xp.asarray(actions), xp.asarray(target))[0])
        numeric[index] = (plus - minus) / 2e-6
    np.testing.assert_allclose(grad, numeric, atol=1e-8)


def test_return_loss_and_gradient(xp: ModuleType) -> None:
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((5, 21))
    bins = np.array([0, 20, 10, 3, 3])
    loss, grad = return_loss_and_grad(xp.asarray(logits), xp.asarray(bins))
    expected = -to_numpy(log_softmax(xp.asarray(logits)))[np.arange(5), bins].mean()
    assert float(loss) == pytest.approx(expected, rel=1e-12)
    numeric = np.zeros_like(logits)
    for index in np.ndindex(*logits.shape):
        bumped = logits.copy()
        bumped[index] += 1e-6
        plus = float(return_loss_and_grad(xp.asarray(bumped), xp.asarray(bins))[0])
        bumped[index] -= 2e-6
        minus = float(return_loss_and_grad(xp.asarray(bumped), xp.asarray(bins))[0])
        numeric[index] = (plus - minus) / 2e-6
    np.testing.assert_allclose(to_numpy(grad), numeric, atol=1e-8)


def test_losses_reject_bad_labels_and_shapes(xp: ModuleType) -> None:
    logits = xp.zeros((2, 3, 7))
    target = xp.full((2, 7), 1.0 / 7)
    with pytest.raises(ModelError, match="actions must lie in"):
        c51_loss_and_grad(logits, xp.asarray([0, 3]), target)
    with pytest.raises(ModelError, match="actions"):
        c51_loss_and_grad(logits, xp.asarray([0, 1, 2]), target)
    with pytest.raises(ModelError, match="target_bins must lie in"):
        return_loss_and_grad(xp.zeros((2, 5)), xp.asarray([-1, 0]))
    with pytest.raises(ModelError, match="next_probs"):
        c51_project(xp.zeros((2, 5)), xp.zeros(2), xp.zeros(2), c51_support(CFG, xp))
    probs = xp.full((2, CFG.n_atoms), 1.0 / CFG.n_atoms)
    with pytest.raises(ModelError, match="rewards must be finite"):
        c51_project(probs, xp.asarray([0.0, np.nan]), xp.zeros(2), c51_support(CFG, xp, np.float64))
    with pytest.raises(ModelError, match="discounts"):
        c51_project(probs, xp.zeros(2), xp.asarray([0.5, 1.5]), c51_support(CFG, xp, np.float64))


def test_return_bins_nearest_centre_with_clamped_tails(xp: ModuleType) -> None:
    centres = to_numpy(return_bin_centres(CFG, xp, np.float64))
    np.testing.assert_allclose(centres[[0, 10, 20]], [-10.0, 0.0, 10.0])
    ticks = xp.asarray([-50.0, -10.0, -9.6, -0.49, 0.0, 0.51, 3.0, 9.4, 10.0, 1e6])
    np.testing.assert_array_equal(to_numpy(return_bin_of(ticks, CFG)), [0, 0, 0, 10, 10, 11, 13, 19, 20, 20])


def test_return_bins_reject_nan(xp: ModuleType) -> None:
    with pytest.raises(ModelError, match="NaN or Inf"):
        return_bin_of(xp.asarray([0.0, float("nan")]), CFG)


def test_return_moments(xp: ModuleType) -> None:
    centres = return_bin_centres(CFG, xp, np.float64)
    probs = np.zeros((2, 21))
    probs[0, 10] = 1.0  # a point mass at 0 ticks
    probs[1, [8, 12]] = 0.5  # +-2 ticks
    mean, var = return_moments(xp.asarray(probs), centres)
    np.testing.assert_allclose(to_numpy(mean), [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(to_numpy(var), [0.0, 4.0], atol=1e-12)


def _munchausen_loops(case: tuple[np.ndarray, ...], alpha: float, tau: float, l0: float) -> np.ndarray:
    """ALGORITHMS 2's M-C51 target written out term by term (float64 loops); ``case`` is
    (p, q_next, q_now, a, r, d, z)."""
    p, q_next, q_now, a, r, d, z = case
    batch, n_actions, n = p.shape
    dz = (z[-1] - z[0]) / (n - 1)
    out = np.zeros((batch, n))
    for b in range(batch):

        def tlp(q: np.ndarray) -> np.ndarray:
            mx = q.max()
            return q - mx - tau * np.log(sum(np.exp((qa - mx) / tau) for qa in q))

        t_next, t_now = tlp(q_next[b]), tlp(q_now[b])
        pi = np.exp(t_next / tau)
        bonus = alpha * min(max(t_now[a[b]], l0), 0.0)
        for i in range(n):
            for ap in range(n_actions):
                for j in range(n):
                    target = min(max(r[b] + bonus + d[b] * (z[j] - t_next[ap]), z[0]), z[-1])
                    out[b, i] += pi[ap] * p[b, ap, j] * min(max(1.0 - abs(target - z[i]) / dz, 0.0), 1.0)
    return out


def test_munchausen_target_is_the_written_out_formula_and_keeps_mass(xp: ModuleType) -> None:
    rng = np.random.default_rng(12)
    cfg = ModelConfig(n_atoms=11, v_min=-5.0, v_max=5.0)
    batch = 6
    p = to_numpy(q_probs(xp.asarray(rng.standard_normal((batch, 3, cfg.n_atoms)))))
    q_next, q_now = rng.standard_normal((batch, 3)), rng.standard_normal((batch, 3))
    a = np.array([0, 1, 2, 0, 1, 2])
    r = np.array([0.3, -1.2, 4.9, 9.0, -12.0, 0.0])
    d = np.array([0.7, 0.0, 0.7, 0.7, 0.7, 1.0])
    z = to_numpy(c51_support(cfg, xp, np.float64))

    def project(alpha: float, tau: float) -> np.ndarray:
        return to_numpy(
            munchausen_project(
                xp.asarray(p),
                xp.asarray(q_next),
                xp.asarray(q_now),
                actions=xp.asarray(a),
                rewards=xp.asarray(r),
                discounts=xp.asarray(d),
                support=xp.asarray(z),
                alpha=alpha,
                tau=tau,
                clip_low=-1.0,
            )
        )

    m = project(alpha=0.9, tau=0.3)
    np.testing.assert_allclose(
        m, _munchausen_loops((p, q_next, q_now, a, r, d, z), 0.9, 0.3, -1.0), atol=1e-12
    )
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
    # Without the bonus and at a vanishing temperature pi is the target's argmax: plain C51 targets.
    greedy = project(alpha=0.0, tau=1e-6)
    best = p[np.arange(batch), np.argmax(q_next, axis=1)]
    np.testing.assert_allclose(
        greedy,
        to_numpy(c51_project_ref(xp.asarray(best), xp.asarray(r), xp.asarray(d), xp.asarray(z))),
        atol=1e-9,
    )
