"""Parity of every CUDA kernel with its NumPy reference (fixed seeds, outputs poisoned first).

Tolerances per dtype: integer and bit-level outputs (Philox words, Thompson actions and draws,
window contents) must match exactly; float32 softmax moments to 1e-5 relative; the fused
network forward (float32, against the model's forward in float64) to 1e-4 of the logits'
scale; Kelly's float64 solve to 1e-9 relative. The whole-decision kernel against the chain of
references: the stages' tolerances, and actions drawn from float32 probabilities may flip where
a draw lands within rounding of a CDF step.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Literal

import numpy as np
import pytest

from agent.kernels.kelly import kelly_size, kelly_size_ref
from agent.kernels.mamba_forward import VARIANTS, mamba_forward, mamba_forward_ref
from agent.kernels.philox import philox4x32, philox4x32_ref
from agent.kernels.softmax_ev import softmax_ev, softmax_ev_ref
from agent.kernels.thompson import thompson, thompson_ref
from agent.model.config import ModelConfig
from agent.policy.config import PolicyConfig
from tests.gpu.conftest import SMALL, make_checkpoint, packed_for
from tests.support.decide_chain import check_reference_chain, check_rings, launcher

pytestmark = pytest.mark.gpu

POISON_F = np.float32(np.nan)


def poisoned(cp: ModuleType, shape: tuple[int, ...], dtype: Any) -> Any:
    """An output array filled with a value no kernel writes (NaN, or the dtype's max)."""
    dt = np.dtype(dtype)
    fill = np.nan if dt.kind == "f" else np.iinfo(dt).max
    return cp.full(shape, fill, dtype=dt)


def test_philox_known_answers_and_random_counters_bit_exact(cp: ModuleType) -> None:
    kat_ctr = np.array(
        [[0, 0, 0, 0], [0xFFFFFFFF] * 4, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]], dtype=np.uint32
    )
    kat_key = np.array([[0, 0], [0xFFFFFFFF] * 2, [0xA4093822, 0x299F31D0]], dtype=np.uint32)
    expected = np.array(
        [
            [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8],
            [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ],
        dtype=np.uint32,
    )
    np.testing.assert_array_equal(cp.asnumpy(philox4x32(cp.asarray(kat_ctr), cp.asarray(kat_key))), expected)
    rng = np.random.default_rng(11)
    ctr = rng.integers(0, 2**32, size=(5000, 4), dtype=np.uint32)
    key = rng.integers(0, 2**32, size=(5000, 2), dtype=np.uint32)
    np.testing.assert_array_equal(
        cp.asnumpy(philox4x32(cp.asarray(ctr), cp.asarray(key))), philox4x32_ref(ctr, key)
    )


def test_thompson_matches_reference_exactly(cp: ModuleType) -> None:
    rng = np.random.default_rng(3)
    rows, n_actions, n_atoms = 4096, 3, 51
    probs = rng.dirichlet(np.full(n_atoms, 0.3), size=(rows, n_actions)).astype(np.float32)
    probs[:50] = probs[:50] * np.float32(0.7)  # unnormalised rows: the threshold scales with CDF[N-1]
    probs[50:60] = 0.0  # an all-zero row clamps to the last atom
    probs[60:70] = 0.0  # every action certain of the same atom: the draws tie, the lowest index wins
    probs[60:70, :, 20] = 1.0
    support = np.linspace(-10, 10, n_atoms, dtype=np.float32)
    env = rng.permutation(rows).astype(np.int32)
    step = rng.integers(0, 2**40, size=rows, dtype=np.uint64)
    action, value = thompson(
        cp.asarray(probs),
        cp.asarray(support),
        12345,
        cp.asarray(env),
        cp.asarray(step),
        action=poisoned(cp, (rows,), np.int32),
        value=poisoned(cp, (rows, n_actions), np.float32),
    )
    ref = thompson_ref(probs, support, 12345, env, step)
    np.testing.assert_array_equal(cp.asnumpy(value), ref.value)
    np.testing.assert_array_equal(cp.asnumpy(action), ref.action)
    assert (ref.action[60:70] == 0).all()


def test_softmax_ev_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng(4)
    for rows, n in ((3 * 1000, 51), (1000, 21), (7, 128), (5, 2)):
        logits = (rng.normal(size=(rows, n)) * 5).astype(np.float32)
        support = np.sort(rng.normal(size=n) * 3).astype(np.float32)
        probs, mean, var = softmax_ev(
            cp.asarray(logits),
            cp.asarray(support),
            probs=poisoned(cp, (rows, n), np.float32),
            mean=poisoned(cp, (rows,), np.float32),
            var=poisoned(cp, (rows,), np.float32),
        )
        p_ref, m_ref, v_ref = softmax_ev_ref(logits, support)
        np.testing.assert_allclose(cp.asnumpy(probs), p_ref, rtol=1e-5, atol=1e-7)
        scale = np.abs(support).max()
        np.testing.assert_allclose(cp.asnumpy(mean), m_ref, rtol=1e-5, atol=1e-5 * scale)
        np.testing.assert_allclose(cp.asnumpy(var), v_ref, rtol=1e-4, atol=1e-5 * scale**2)


def test_kelly_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng(6)
    rows, bins = 5000, 21
    probs = rng.dirichlet(np.full(bins, 0.5), size=rows).astype(np.float32)
    probs[:20, :10] = 0.0  # no losing bin for a long: f* = inf, size 1
    ticks = np.linspace(-10, 10, bins)
    direction = rng.integers(-1, 2, size=rows).astype(np.int32)
    tick_value = rng.choice([5.0, 12.5, 50.0], size=rows)
    regime = rng.uniform(-0.2, 1.3, size=rows).astype(np.float32)
    regime[:5] = np.nan
    spread = rng.uniform(-0.5, 3.0, size=rows).astype(np.float32)
    spread[5:10] = np.nan
    position = rng.integers(-2, 3, size=rows).astype(np.int32)
    policy = PolicyConfig(
        kelly_fraction=0.5, capital_per_contract=2000.0, max_contracts=7, min_edge_ticks=0.1
    )
    target, size, f_star, mean = (
        cp.asnumpy(a)
        for a in kelly_size(
            cp.asarray(probs),
            cp.asarray(ticks),
            cp.asarray(direction),
            cp.asarray(tick_value),
            cp.asarray(regime),
            spread_ticks=cp.asarray(spread),
            position=cp.asarray(position),
            policy=policy,
            fee_per_contract=1.5,
        )
    )
    ref = kelly_size_ref(
        probs,
        ticks,
        direction,
        tick_value,
        regime,
        spread_ticks=spread,
        position=position,
        policy=policy,
        fee_per_contract=1.5,
    )
    np.testing.assert_allclose(mean, ref.mean_return, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(f_star, ref.f_star, rtol=1e-9)
    np.testing.assert_allclose(size, ref.size, rtol=1e-9)
    raw = ref.size * ref.scale * policy.max_contracts
    near_integer = np.abs(raw - np.floor(raw) - 0.5) < 1e-9  # round-to-nearest ties
    np.testing.assert_array_equal(target[~near_integer], ref.target[~near_integer])
    assert (ref.size[:20][direction[:20] == 1] == 1.0).all()
    assert np.count_nonzero(ref.target) > rows // 10  # the case exercises real sizes


@pytest.mark.parametrize(
    "cfg",
    [SMALL, ModelConfig(n_features=32), ModelConfig(n_features=5, window=16, n_layers=3, d_state=8)],
    ids=["small", "default", "three-layers"],
)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_forward_matches_model_forward(cp: ModuleType, cfg: ModelConfig, variant: str) -> None:
    ck = make_checkpoint(cfg, seed=7, scale=4.0)
    rng = np.random.default_rng(8)
    slots_n, rows = 70, 64
    window = (rng.normal(size=(slots_n, cfg.window, cfg.n_features)) * 2).astype(np.float32)
    slots = rng.permutation(slots_n)[:rows].astype(np.int32)
    slots[-3:] = -1
    packed = cp.asarray(packed_for(ck, VARIANTS[variant]))
    n_q = cfg.n_actions * cfg.n_atoms
    q, r = mamba_forward(
        packed,
        cfg,
        cp.asarray(window),
        cp.asarray(slots),
        q_logits=poisoned(cp, (rows, n_q), np.float32),
        ret_logits=poisoned(cp, (rows, cfg.return_bins), np.float32),
        variant=VARIANTS[variant],
    )
    q_ref, r_ref = mamba_forward_ref(
        ck.params, cfg, window, slots[:-3], feature_mean=ck.norm_mean, feature_std=ck.norm_std
    )
    q_got, r_got = cp.asnumpy(q), cp.asnumpy(r)
    assert np.isnan(q_got[-3:]).all() and np.isnan(r_got[-3:]).all()  # padded rows untouched
    for got, ref in ((q_got[:-3].reshape(q_ref.shape), q_ref), (r_got[:-3], r_ref)):
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-4, err


@pytest.mark.parametrize("selection", ["thompson", "greedy"])
@pytest.mark.parametrize("cfg", [SMALL, ModelConfig(n_features=32)], ids=["small", "default"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_decide_matches_the_reference_chain(
    cp: ModuleType, cfg: ModelConfig, variant: str, selection: Literal["thompson", "greedy"]
) -> None:
    ck = make_checkpoint(cfg, seed=9, scale=3.0)
    check_reference_chain(ck, launcher(cp, ck), VARIANTS[variant], selection, rows=64)


@pytest.mark.parametrize("cfg", [SMALL, ModelConfig(n_features=32)], ids=["small", "default"])
def test_the_ring_of_cached_rows_is_the_same_in_every_variant(cp: ModuleType, cfg: ModelConfig) -> None:
    ck = make_checkpoint(cfg, seed=9, scale=3.0)
    check_rings(ck, launcher(cp, ck))
