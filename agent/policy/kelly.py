"""Exact discrete Kelly sizing with the regime scale (ALGORITHMS.md section 4, DESIGN section 7).

The return head gives a categorical over next-horizon mid moves in ticks. For a chosen
direction d in {-1, 0, +1} a bin of ``t`` ticks is the simple return on the capital allotted to
one contract, ``R = d * t * tick_value / capital_per_contract``. The exact Kelly fraction solves

    f* = argmax_{f >= 0} G(f),  G(f) = sum_i p_i ln(1 + f R_i),  1 + f R_i > 0 where p_i > 0,

by safeguarded Newton (start mu / E[R^2], a step leaving the bracket goes halfway to the bound
it violates, at most 20 iterations); G is concave so G' is monotone and the bracket always
holds the root. ``mu / sigma^2`` is only its small-return approximation. Then

    size      = clip(kelly_fraction * f*, 0, 1)
    contracts = min(max_contracts, max(1, floor(size * regime * max_contracts + 1/2)))
    target    = d * contracts

**Cost gate.** A view is only taken when it pays for itself, leg by leg, as the paper broker
and the training environment charge: a leg (a position change of one contract's worth) costs
:func:`leg_cost`, half the spread of the decision's book plus the broker's fee (the fee alone
under the control experiment of mid fills, ``policy.leg_price = "mid"``). Opening from
flat is one leg, reversing two, keeping the position's direction none: ``mu`` must exceed
``legs * leg_cost`` plus ``min_edge_ticks`` when there is a leg to pay, and only be positive to
keep a position. The exit leg is not charged at entry: it is paid when the view changes, and
that decision passes the same gate then. Without the hysteresis a view hovering at the cost
would churn in and out, paying two legs each time; charging the whole round trip at entry
against a one-horizon return would almost never let a short-horizon view open at all.

**Rounding.** Round to nearest, with at least one contract once the gate passed: the gate
decides *whether* the model's view is expressed, Kelly and the regime scale decide *how much*
beyond the first contract. A floor would turn every regime scale below 1 into flat at
``max_contracts = 1`` (the regime could then switch the policy off without any view change);
at one contract the regime cannot shrink a position without removing it, so it scales only
the contracts above the first.
This module is the CPU path and the reference of ``agent/kernels/kelly.cu``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from agent.execution.config import FillPrice
from agent.policy.config import PolicyConfig

__all__ = [
    "MAX_NEWTON_ITERATIONS",
    "KellySizing",
    "contracts_of",
    "kelly_fraction_exact",
    "kelly_size_ref",
    "leg_cost",
    "regime_clamp",
]

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


def leg_cost(
    spread_ticks: npt.ArrayLike,
    tick_value: npt.ArrayLike,
    fee_per_contract: float,
    *,
    leg_price: FillPrice = "book",
) -> npt.NDArray[np.float64]:
    """Currency cost of one leg of one contract: bought or sold at the touch (``book``, what a
    venue and the paper broker charge) it costs half the spread plus the fee; at the mid
    (``mid``, the control experiment of ``broker.fill_price = "mid"``) the fee alone. NaN or
    negative spreads give +inf either way (no trade on a book without one)."""
    spread = np.asarray(spread_ticks, dtype=np.float64)
    half_spread = 0.5 * spread * np.asarray(tick_value, dtype=np.float64)
    cost = (half_spread if leg_price == "book" else np.zeros_like(half_spread)) + fee_per_contract
    return np.where(np.isfinite(spread) & (spread >= 0), cost, np.inf)


def contracts_of(size: npt.ArrayLike, scale: npt.ArrayLike, max_contracts: int) -> npt.NDArray[np.int64]:
    """Contracts for Kelly ``size`` (> 0 once the cost gate passed) at regime ``scale``: round to
    nearest, at least 1, at most ``max_contracts`` (see the module docstring); 0 where size is 0."""
    s = np.asarray(size, dtype=np.float64)
    n = np.floor(s * np.asarray(scale, dtype=np.float64) * max_contracts + 0.5)
    return np.where(s > 0, np.clip(n, min(1, max_contracts), max_contracts), 0).astype(np.int64)


def kelly_size_ref(
    ret_probs: npt.ArrayLike,
    bin_ticks: npt.ArrayLike,
    direction: npt.ArrayLike,
    tick_value: npt.ArrayLike,
    regime_scale: npt.ArrayLike,
    *,
    spread_ticks: npt.ArrayLike,
    position: npt.ArrayLike,
    policy: PolicyConfig,
    fee_per_contract: float,
) -> KellySizing:
    """Target positions from the return head.

    Args:
        ret_probs: (B, bins) return-head probabilities over tick bins.
        bin_ticks: (bins,) centre of each bin in ticks (next-horizon mid move).
        direction: (B,) chosen direction in {-1, 0, +1}.
        tick_value: (B,) currency value of one tick of one contract of each row's instrument.
        regime_scale: (B,) regime scale; clamped to [scale_floor, 1], non-finite -> scale_floor.
        spread_ticks: (B,) spread of the decision's book in ticks (the cost gate's spread).
        position: (B,) current position in contracts (the legs the direction costs).
        policy: the sizing settings (``policy.leg_price``: the spread a leg pays, :func:`leg_cost`).
        fee_per_contract: the broker's fee per contract and leg (currency).
    """
    p = np.asarray(ret_probs, dtype=np.float64)
    d = np.asarray(direction, dtype=np.float64)
    ticks = np.asarray(bin_ticks, dtype=np.float64)
    tv = np.asarray(tick_value, dtype=np.float64)
    per_tick = tv / policy.capital_per_contract
    returns = d[:, None] * ticks[None, :] * per_tick[:, None]
    total = p.sum(axis=1)
    mean = np.divide((p * returns).sum(axis=1), total, out=np.zeros_like(total), where=total > 0)
    legs = np.abs(d - np.sign(np.asarray(position, dtype=np.float64)))
    leg = leg_cost(spread_ticks, tv, fee_per_contract, leg_price=policy.leg_price)
    paying = legs > 0
    charged = np.where(paying, legs, 1.0) * leg + policy.min_edge_ticks * tv  # inf * 0 never formed
    required = np.where(paying, charged, 0.0) / policy.capital_per_contract
    trade = (d != 0) & (mean > required)
    f_star = np.zeros_like(mean)
    if trade.any():
        f_star[trade] = kelly_fraction_exact(returns[trade], p[trade])
    size = np.clip(policy.kelly_fraction * f_star, 0.0, 1.0)
    scale = regime_clamp(regime_scale, policy.scale_floor)
    target = (d * contracts_of(size, scale, policy.max_contracts)).astype(np.int32)
    return KellySizing(target, size, f_star, mean, scale)
