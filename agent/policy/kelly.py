"""Exact discrete Kelly sizing with the regime scale (ALGORITHMS.md section 4, DESIGN section 7).

The return head gives a categorical over next-horizon mid moves in ticks. For a chosen
direction d in {-1, 0, +1} a bin of ``t`` ticks is the simple return on the capital allotted to
one contract, ``R = d * t * tick_value / capital_per_contract``. The exact Kelly fraction solves

    f* = argmax_{f >= 0} G(f),  G(f) = sum_i p_i ln(1 + f R_i),  1 + f R_i > 0 where p_i > 0,

by safeguarded Newton (start mu / E[R^2], a step leaving the bracket goes halfway to the bound
it violates, at most 20 iterations); G is concave so G' is monotone and the bracket always
holds the root. ``mu / sigma^2`` is only its small-return approximation. Then

    size   = clip(kelly_fraction * f*, 0, 1)
    target = d * floor(size * clamp(regime, scale_floor, 1) * max_contracts)

and the policy stays flat when the expected return does not cover the round-trip cost.
This module is the CPU path and the reference of ``agent/kernels/kelly.cu``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from agent.policy.config import PolicyConfig

__all__ = ["MAX_NEWTON_ITERATIONS", "KellySizing", "kelly_fraction_exact", "kelly_size_ref", "regime_clamp"]

MAX_NEWTON_ITERATIONS = 20
_TOL = 1e-12


class KellySizing(NamedTuple):
    target: npt.NDArray[np.int32]
    """(B,) signed target position in contracts."""
    size: npt.NDArray[np.float64]
    """(B,) clip(kelly_fraction * f*, 0, 1); 0 when flat."""
    f_star: npt.NDArray[np.float64]
    """(B,) exact Kelly fraction in the chosen direction (inf when no bin loses; 0 when flat)."""
    mean_return: npt.NDArray[np.float64]
    """(B,) expected simple return per contract in the chosen direction."""
    scale: npt.NDArray[np.float64]
    """(B,) regime scale actually applied, in [scale_floor, 1]."""


def kelly_fraction_exact(returns: npt.ArrayLike, probs: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Exact discrete Kelly fraction over f >= 0, float64.

    Args:
        returns: (B, N) simple returns R_i of the bins (or (N,) shared by all rows).
        probs: (B, N) probabilities p_i >= 0 (normalised here; rows summing to 0 give 0).

    Returns:
        (B,) f*: 0 when mu <= 0, +inf when no bin with p_i > 0 loses (G grows without bound),
        else the root of G' inside (0, -1/min{R_i : p_i > 0}).
    """
    p = np.asarray(probs, dtype=np.float64)
    r = np.asarray(returns, dtype=np.float64)
    if r.shape != p.shape:
        r = np.broadcast_to(r, p.shape)
    total = p.sum(axis=-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    pr = p * r
    mu = pr.sum(axis=-1)
    second = (pr * r).sum(axis=-1)
    worst = np.where(p > 0, r, np.inf).min(axis=-1)
    bounded = worst < 0
    hi = np.where(bounded, -1.0 / np.where(bounded, worst, -1.0), np.inf)
    gain = mu > 0
    solve = gain & bounded
    f_star = np.where(gain, np.inf, 0.0)
    if not solve.any():
        return f_star
    if not solve.all():  # the rows to solve only (a small batch usually solves all of its rows)
        p, r, hi, mu, second = p[solve], r[solve], hi[solve], mu[solve], second[solve]
    # Few array operations an iteration: at small batches each costs more than its arithmetic.
    # Written so that every value is bit-identical to the textbook form: q = r / (1 + f r),
    # G' = sum p q, G'' = -sum p q^2, step = f - G'/G'' (= f + G'/sum p q^2 exactly).
    lo = np.zeros_like(mu)
    f = mu / second
    f = np.where(f < hi, f, 0.5 * hi)
    for _ in range(MAX_NEWTON_ITERATIONS):
        q = f[:, None] * r
        q += 1.0
        np.divide(r, q, out=q)
        pq = p * q
        g1 = pq.sum(axis=-1)
        pq *= q
        step = g1 / pq.sum(axis=-1)
        step += f
        rising = g1 > 0
        lo = np.where(rising, f, lo)
        hi = np.where(rising, hi, f)
        over = step >= hi
        under = step <= lo
        if over.any() or under.any():  # a step leaving the bracket goes halfway to its bound
            step = np.where(over, 0.5 * (f + hi), np.where(under, 0.5 * (f + lo), step))
        moved = step - f
        done = np.abs(moved, out=moved) <= _TOL * f
        f = step
        if done.all():
            break
    f_star[solve] = f
    return f_star


def regime_clamp(regime_scale: npt.ArrayLike, scale_floor: float) -> npt.NDArray[np.float64]:
    """The regime scale applied to sizes: clamp to [scale_floor, 1]; NaN or inf -> scale_floor."""
    raw = np.asarray(regime_scale, dtype=np.float64)
    return np.clip(np.where(np.isfinite(raw), raw, scale_floor), scale_floor, 1.0)


def kelly_size_ref(
    ret_probs: npt.ArrayLike,
    bin_ticks: npt.ArrayLike,
    direction: npt.ArrayLike,
    tick_value: npt.ArrayLike,
    regime_scale: npt.ArrayLike,
    *,
    policy: PolicyConfig,
) -> KellySizing:
    """Target positions from the return head.

    Args:
        ret_probs: (B, bins) return-head probabilities over tick bins.
        bin_ticks: (bins,) centre of each bin in ticks (next-horizon mid move).
        direction: (B,) chosen direction in {-1, 0, +1}.
        tick_value: (B,) currency value of one tick of one contract of each row's instrument.
        regime_scale: (B,) regime scale; clamped to [scale_floor, 1], non-finite -> scale_floor.
        policy: the sizing settings.
    """
    p = np.asarray(ret_probs, dtype=np.float64)
    d = np.asarray(direction, dtype=np.float64)
    ticks = np.asarray(bin_ticks, dtype=np.float64)
    per_tick = np.asarray(tick_value, dtype=np.float64) / policy.capital_per_contract
    returns = d[:, None] * ticks[None, :] * per_tick[:, None]
    total = p.sum(axis=1)
    mean = np.divide((p * returns).sum(axis=1), total, out=np.zeros_like(total), where=total > 0)
    cost = policy.cost_per_contract / policy.capital_per_contract
    trade = (d != 0) & (mean > cost)
    f_star = np.zeros_like(mean)
    if trade.any():
        f_star[trade] = kelly_fraction_exact(returns[trade], p[trade])
    size = np.clip(policy.kelly_fraction * f_star, 0.0, 1.0)
    scale = regime_clamp(regime_scale, policy.scale_floor)
    target = (d * np.floor(size * scale * policy.max_contracts)).astype(np.int32)
    return KellySizing(target, size, f_star, mean, scale)
