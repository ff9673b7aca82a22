"""The engine's fused forward (agent/kernels/mamba_forward.cu) against the model's forward, on the
CPU emulation: both compiled variants, a model with every structural feature (two groups, K >
conv width), the same with a window that the scan's shares do not divide, and the default
shape, padded rows left unwritten. tests/gpu/test_kernels.py runs
the same comparison on a device."""

from __future__ import annotations

from types import ModuleType

import msgspec
import numpy as np
import pytest

from agent.kernels.mamba_forward import (
    VARIANTS,
    cluster_ranks,
    forward_layout,
    mamba_forward_ref,
    shared_bytes,
)
from agent.model.config import ModelConfig
from tests.gpu.conftest import SMALL, make_checkpoint, packed_for


@pytest.mark.parametrize(
    "cfg",
    [SMALL, msgspec.structs.replace(SMALL, window=7), ModelConfig(n_features=32)],
    ids=["small", "odd-window", "default"],
)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_forward_matches_the_model(emu: ModuleType, cfg: ModelConfig, variant: str) -> None:
    form = VARIANTS[variant]
    ck = make_checkpoint(cfg, seed=7, scale=4.0)
    rng = np.random.default_rng(8)
    slots_n, rows = 6, 4
    window = (rng.normal(size=(slots_n, cfg.window, cfg.n_features)) * 2).astype(np.float32)
    slots = rng.permutation(slots_n)[:rows].astype(np.int32)
    slots[-1] = -1  # a padded row
    ranks = cluster_ranks(cfg, form)
    fn = emu.module("mamba_forward.cu", (*forward_layout(cfg, ranks).options, *form.options())).get_function(
        "mamba_forward_kernel"
    )
    q = np.full((rows, cfg.n_actions * cfg.n_atoms), np.nan, np.float32)
    r = np.full((rows, cfg.return_bins), np.nan, np.float32)
    packed = packed_for(ck, form)
    fn((rows * ranks,), (form.threads,), (packed, window, slots, q, r), shared_mem=shared_bytes(cfg, form))
    q_ref, r_ref = mamba_forward_ref(
        ck.params, cfg, window, slots[:-1], feature_mean=ck.norm_mean, feature_std=ck.norm_std
    )
    assert np.isnan(q[-1]).all() and np.isnan(r[-1]).all()
    for got, ref in ((q[:-1].reshape(q_ref.shape), q_ref), (r[:-1], r_ref)):
        assert np.abs(got - ref).max() < 1e-5 * np.abs(ref).max()
