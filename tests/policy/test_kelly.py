"""Exact discrete Kelly and the sizing rule (ALGORITHMS.md section 4, DESIGN section 7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from agent.config import ConfigError, load_config
from agent.policy.config import PolicyConfig
from agent.policy.kelly import (
    KellySizing,
    contracts_of,
    kelly_fraction_exact,
    kelly_size_ref,
    leg_cost,
    regime_clamp,
)

R = np.array([-2, -1, 0, 1, 2, 3]) / 100
P = np.array([0.1, 0.2, 0.25, 0.2, 0.15, 0.1])


def g_prime(f: float, r: np.ndarray, p: np.ndarray) -> float:
    return float((p * r / (1 + f * r)).sum())


def test_the_algorithms_md_case() -> None:
    mu = (P * R).sum()
    var = (P * R * R).sum() - mu**2
    f = kelly_fraction_exact(R[None], P[None])[0]
    assert round(f, 1) == 19.3
    assert round(mu / var, 1) == 18.7  # the small-return approximation is not the answer
    assert round(mu / (P * R * R).sum(), 1) == 17.4
    assert abs(g_prime(f, R, P)) < 1e-9
    assert (1 + f * R > 0).all()


def test_exact_root_on_random_distributions_matches_bisection() -> None:
    rng = np.random.default_rng(0)
    r = np.linspace(-5, 5, 21) / 200
    p = rng.dirichlet(np.full(21, 0.4), size=300)
    p[:, 12:] *= 1.5  # tilt towards gains: most rows have mu > 0
    p /= p.sum(axis=1, keepdims=True)
    f = kelly_fraction_exact(r, p)
    for row, fi in zip(p, f, strict=True):
        mu = (row * r).sum()
        if mu <= 0:
            assert fi == 0.0
            continue
        lo, hi = 0.0, -1 / r[row > 0].min()
        for _ in range(200):  # plain bisection on the monotone G'
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if g_prime(mid, r, row) > 0 else (lo, mid)
        assert fi == pytest.approx(lo, rel=1e-8)


def test_heavy_left_tail_keeps_the_solution_inside_the_domain() -> None:
    r = np.array([-0.9, 0.01, 0.02])
    p = np.array([1e-4, 0.5, 0.4999])
    f = kelly_fraction_exact(r[None], p[None])[0]
    assert 0 < f < 1 / 0.9
    assert abs(g_prime(f, r, p)) < 1e-8


def test_no_losing_bin_is_unbounded_and_negative_edge_is_zero() -> None:
    r = np.array([-0.01, 0.0, 0.01])
    assert kelly_fraction_exact(r[None], np.array([[0.0, 0.5, 0.5]]))[0] == np.inf
    assert kelly_fraction_exact(r[None], np.array([[0.5, 0.3, 0.2]]))[0] == 0.0
    assert kelly_fraction_exact(r[None], np.array([[0.0, 0.0, 0.0]]))[0] == 0.0


POLICY = PolicyConfig(kelly_fraction=0.5, capital_per_contract=1000.0, max_contracts=10, min_edge_ticks=0.5)
TICKS = np.linspace(-10, 10, 21)
FEE = 1.0
"""Fee per contract and leg: with a 1-tick spread at 12.5 a tick, a leg costs 7.25 (0.58 ticks)."""


def probs_with_mean(mean_ticks: float) -> npt.NDArray[np.float64]:
    """A distribution over TICKS centred near ``mean_ticks`` (softmax of a quadratic)."""
    logits = -0.5 * ((TICKS - mean_ticks) / 3.0) ** 2
    p = np.exp(logits - logits.max())
    out: npt.NDArray[np.float64] = p / p.sum()
    return out


def size(
    p: npt.ArrayLike,
    direction: list[int],
    regime: list[float],
    *,
    spread: list[float] | None = None,
    position: list[int] | None = None,
    policy: PolicyConfig = POLICY,
) -> KellySizing:
    n = len(direction)
    return kelly_size_ref(
        p,
        TICKS,
        direction,
        [12.5] * n,
        regime,
        spread_ticks=[1.0] * n if spread is None else spread,
        position=[0] * n if position is None else position,
        policy=policy,
        fee_per_contract=FEE,
    )


def test_a_leg_costs_half_the_spread_plus_the_fee() -> None:
    np.testing.assert_allclose(leg_cost([1.0, 2.0], [12.5, 12.5], 1.0), [7.25, 13.5])
    assert leg_cost([np.nan], [12.5], 1.0)[0] == np.inf
    assert leg_cost([-1.0], [12.5], 1.0)[0] == np.inf


def test_size_target_and_direction() -> None:
    p = np.stack([probs_with_mean(3.0)] * 3)
    out = size(p, [1, -1, 0], [0.6] * 3)
    returns = TICKS * 12.5 / 1000.0
    f_long = kelly_fraction_exact(returns[None], p[:1])[0]
    assert out.f_star[0] == pytest.approx(f_long)
    assert out.size[0] == pytest.approx(min(0.5 * f_long, 1.0))
    assert out.target[0] == max(1, int(np.floor(out.size[0] * 0.6 * 10 + 0.5)))
    assert out.target[0] > 0
    assert out.mean_return[1] < 0 and out.target[1] == 0 and out.size[1] == 0  # short against the edge
    assert out.target[2] == 0 and out.f_star[2] == 0  # flat


def test_opening_pays_one_leg_reversing_two_keeping_none() -> None:
    # an expected move of ~0.9 ticks: above one leg (0.58 ticks) + the 0.5-tick margin? no;
    # above one leg alone, and below two legs
    p = probs_with_mean(0.9)[None]
    move = float((p * TICKS).sum())
    leg = 7.25 / 12.5
    assert leg < move < leg + POLICY.min_edge_ticks and move < 2 * leg
    assert size(p, [1], [1.0]).target[0] == 0  # opening: not enough edge over leg + margin
    assert size(p, [1], [1.0], position=[3]).target[0] > 0  # keeping the long: any edge
    no_margin = PolicyConfig(
        kelly_fraction=0.5, capital_per_contract=1000.0, max_contracts=10, min_edge_ticks=0
    )
    assert size(p, [1], [1.0], policy=no_margin).target[0] > 0  # opening: one leg is covered
    assert size(p, [1], [1.0], position=[-2], policy=no_margin).target[0] == 0  # reversing: two legs
    # a wide spread makes the same view too expensive to open
    assert size(p, [1], [1.0], spread=[4.0], policy=no_margin).target[0] == 0
    # no spread (NaN): never opens
    assert size(p, [1], [1.0], spread=[np.nan], policy=no_margin).target[0] == 0


def test_one_contract_expresses_the_view_at_any_regime_scale() -> None:
    one = PolicyConfig(kelly_fraction=0.25, capital_per_contract=25_000.0, max_contracts=1)
    p = np.stack([probs_with_mean(4.0)] * 3)
    out = size(p, [1, 1, -1], [1.0, 0.1, 0.3], policy=one)
    np.testing.assert_array_equal(out.target, [1, 1, 0])  # the short is against the edge
    np.testing.assert_array_equal(contracts_of([0.0, 0.01, 0.4, 1.0], [1.0, 1.0, 0.1, 1.0], 1), [0, 1, 1, 1])
    np.testing.assert_array_equal(contracts_of([0.3, 0.35, 1.0], [1.0, 1.0, 1.0], 10), [3, 4, 10])
    np.testing.assert_array_equal(contracts_of([1.0], [1.0], 0), [0])


def test_regime_scale_is_clamped_and_scales_the_target() -> None:
    np.testing.assert_array_equal(
        regime_clamp([np.nan, np.inf, -1.0, 0.05, 0.5, 2.0], 0.1), [0.1, 0.1, 0.1, 0.1, 0.5, 1]
    )
    p = np.stack([probs_with_mean(3.0)] * 2)
    out = size(p, [1, 1], [1.0, 0.3])
    assert out.target[1] < out.target[0]
    assert out.target[1] == int(np.floor(out.size[1] * 0.3 * 10 + 0.5))


def test_policy_config_is_validated_with_the_key_named(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[policy]\nkelly_fraction = 0.9\n")
    with pytest.raises(ConfigError, match="policy"):
        load_config(path, env={})
    with pytest.raises(ValueError, match="scale_floor"):
        PolicyConfig(scale_floor=0.0)
    path.write_text('[policy]\nselection = "best"\n')
    with pytest.raises(ConfigError, match=r"policy\.selection"):
        load_config(path, env={})
    path.write_text('[policy]\nselection = "greedy"\n')
    assert load_config(path, env={}).policy.selection == "greedy"
