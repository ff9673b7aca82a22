"""The CUDA engine against the CPU engine on the same checkpoint and bars (GPU only).

Q values and return moments agree to float32 tolerance. Actions come from Thompson draws on
probabilities computed by two softmax implementations (expf vs NumPy exp), so a draw landing
within rounding of a CDF step may flip (ALGORITHMS section 6): actions must agree on nearly
every row, and targets wherever the actions agree (away from integer boundaries).
"""

from __future__ import annotations

import numpy as np
import pytest

from agent.gpu.backend import select_backend
from agent.gpu.engine import InferenceEngine
from agent.gpu.errors import ModelLoadError
from agent.model.config import ModelConfig
from agent.policy.config import PolicyConfig
from tests.gpu.conftest import make_checkpoint

pytestmark = pytest.mark.gpu

CFG = ModelConfig(n_features=24)
POLICY = PolicyConfig(
    selection="thompson",
    seed=7,
    kelly_fraction=0.5,
    capital_per_contract=400.0,
    max_contracts=9,
    min_edge_ticks=0.1,
)
SLOTS = 100


def pair(seed: int = 1, max_batch: int = 64) -> tuple[InferenceEngine, InferenceEngine]:
    ck = make_checkpoint(CFG, seed=seed, scale=3.0)
    ticks = np.random.default_rng(0).choice([5.0, 12.5, 50.0], size=SLOTS).tolist()
    return tuple(  # type: ignore[return-value]
        InferenceEngine(
            ck, POLICY, ticks, fee_per_contract=0.5, backend=select_backend(device), max_batch=max_batch
        )
        for device in ("cuda", "cpu")
    )


def test_cuda_engine_matches_cpu_engine_across_buckets() -> None:
    gpu, cpu = pair()
    rng = np.random.default_rng(2)
    agree = total = 0
    for step in range(CFG.window + 6):
        n = [1, 3, 64, 17, 2, 33][step % 6]
        slots = rng.permutation(SLOTS)[:n]
        rows = rng.normal(size=(n, CFG.n_features)).astype(np.float32)
        healthy = rng.random(n) > 0.05
        positions = rng.integers(-3, 4, size=n)
        regime = rng.uniform(0.0, 1.2, size=n)
        g = gpu.decide(slots, rows, positions, regime, healthy)
        c = cpu.decide(slots, rows, positions, regime, healthy)
        np.testing.assert_array_equal(g.valid, c.valid)
        np.testing.assert_array_equal(g.step, c.step)
        np.testing.assert_allclose(g.q, c.q, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(g.ret_mean_ticks, c.ret_mean_ticks, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(g.ret_var_ticks, c.ret_var_ticks, rtol=1e-3, atol=1e-3)
        same = g.action == c.action
        agree += int(same.sum())
        total += n
        np.testing.assert_array_equal(g.target[~g.valid], positions[~g.valid])
        np.testing.assert_array_equal(g.target[same], c.target[same])
    assert agree >= 0.98 * total


def test_cuda_hot_swap_and_failed_load() -> None:
    gpu, _ = pair(seed=1)
    new = make_checkpoint(CFG, seed=5, scale=3.0)
    bad = make_checkpoint(ModelConfig(n_features=CFG.n_features, window=16), seed=5)
    rng = np.random.default_rng(3)
    history = rng.normal(size=(CFG.window + 2, 4, CFG.n_features)).astype(np.float32)
    for rows in history[:-1]:
        gpu.decide([0, 1, 2, 3], rows, np.zeros(4), 1.0)
    old_sha = gpu.model_sha256
    with pytest.raises(ModelLoadError):
        gpu.load(bad)
    assert gpu.model_sha256 == old_sha
    gpu.load(new)
    swapped = gpu.decide([0, 1, 2, 3], history[-1], np.zeros(4), 1.0)
    fresh = InferenceEngine(
        new,
        POLICY,
        gpu.tick_values.tolist(),
        fee_per_contract=0.5,
        backend=select_backend("cuda"),
        max_batch=64,
    )
    for rows in history[:-1]:
        fresh.decide([0, 1, 2, 3], rows, np.zeros(4), 1.0)
    expected = fresh.decide([0, 1, 2, 3], history[-1], np.zeros(4), 1.0)
    assert swapped.model_sha256 == new.sha256
    np.testing.assert_array_equal(swapped.q, expected.q)
    np.testing.assert_array_equal(swapped.action, expected.action)
    np.testing.assert_array_equal(swapped.target, expected.target)
