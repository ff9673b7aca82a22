"""Fixtures of the GPU-layer tests.

Tests marked ``gpu`` (or taking the ``cp`` fixture) need a usable CUDA device and are skipped
cleanly without one, in CI too (CI has no GPU; these run on the H200 by hand). Everything else
here runs on the CPU path.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from agent.gpu.backend import cuda_probe
from agent.gpu.engine import SPREAD_FEATURE
from agent.kernels.mamba_forward import Variant, cluster_ranks, pack_params
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes, checkpoint_to_bytes
from agent.model.config import ModelConfig
from agent.model.params import init_params

SMALL = ModelConfig(
    n_features=6, window=8, d_model=16, n_layers=2, headdim=8, d_state=4, ngroups=2, return_bins=9
)
"""A small model with every structural feature (G = 2, K > conv width) for fast tests."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    backend, reason = cuda_probe()
    if backend is not None:
        return
    skip = pytest.mark.skip(reason=f"needs a usable CUDA device: {reason}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def cp() -> ModuleType:
    """CuPy on a usable device (the test is skipped otherwise)."""
    backend, reason = cuda_probe()
    if backend is None:
        pytest.skip(f"needs a usable CUDA device: {reason}")
    return backend.xp


def make_checkpoint(cfg: ModelConfig = SMALL, seed: int = 0, *, scale: float = 1.0) -> Checkpoint:
    """A verified checkpoint with fresh parameters (heads scaled by ``scale`` so that tests can
    make the distributions sharper) and non-trivial normalisation statistics."""
    rng = np.random.default_rng(seed)
    params: dict[str, Any] = init_params(cfg, rng)
    for name in ("q.W", "q.b", "ret.W", "ret.b"):
        params[name] = params[name] * np.float32(scale)
    mean = rng.normal(size=cfg.n_features).astype(np.float32)
    std = rng.uniform(0.5, 2.0, size=cfg.n_features).astype(np.float32)
    data = checkpoint_to_bytes(
        params,
        cfg,
        feature_names=[SPREAD_FEATURE if i == 2 else f"f{i}" for i in range(cfg.n_features)],
        norm_mean=mean,
        norm_std=std,
        metadata={"seed": seed},
    )
    return checkpoint_from_bytes(data)


def packed_for(ck: Checkpoint, variant: Variant) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The checkpoint's packed buffer as ``variant`` reads it (its cluster ranks' shares)."""
    cfg = ck.config
    return pack_params(ck.params, cfg, ck.norm_mean, ck.norm_std, cluster_ranks(cfg, variant))
