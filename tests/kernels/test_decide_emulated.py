"""The whole-decision kernel (agent/kernels/decide.cu) against the chain of references on the
CPU emulation, in each forward variant: a batch with unhealthy, non-finite and padded rows
(tests/support/decide_chain.py); tests/gpu/test_kernels.py runs the same check on a device."""

from __future__ import annotations

from types import ModuleType
from typing import Literal

import numpy as np
import pytest

from agent.kernels.decide import decide_variant
from agent.kernels.mamba_forward import (
    CLUSTER,
    LATENCY,
    PAIR,
    TENSOR,
    THROUGHPUT,
    VARIANTS,
    Variant,
    cluster_ranks,
    forward_layout,
    shared_bytes,
)
from agent.model.checkpoint import Checkpoint
from agent.model.config import ModelConfig
from tests.gpu.conftest import SMALL, make_checkpoint
from tests.support.decide_chain import Launch, check_reference_chain, check_rings, launcher


@pytest.mark.parametrize(
    ("cfg", "variant", "selection"),
    [
        (ModelConfig(n_features=32), "cluster", "thompson"),
        (SMALL, "cluster", "greedy"),
        (ModelConfig(n_features=32), "pair", "greedy"),
        (SMALL, "latency", "thompson"),
        (SMALL, "throughput", "greedy"),
        (ModelConfig(n_features=32), "tensor", "thompson"),
        (SMALL, "tensor", "greedy"),
    ],
    ids=[
        "cluster-default",
        "cluster-small",
        "pair-default",
        "latency-small",
        "throughput-small",
        "tensor-default",
        "tensor-small",
    ],
)
def test_decide_matches_the_reference_chain(
    emu: ModuleType, cfg: ModelConfig, variant: str, selection: Literal["thompson", "greedy"]
) -> None:
    ck = make_checkpoint(cfg, seed=9, scale=3.0)
    check_reference_chain(ck, _launch(emu, ck), VARIANTS[variant], selection, rows=16)


@pytest.mark.parametrize("cfg", [SMALL, ModelConfig(n_features=32)], ids=["small", "default"])
def test_the_ring_of_cached_rows_is_the_same_in_every_variant(emu: ModuleType, cfg: ModelConfig) -> None:
    ck = make_checkpoint(cfg, seed=9, scale=3.0)
    check_rings(ck, _launch(emu, ck))


def _launch(emu: ModuleType, ck: Checkpoint) -> Launch:
    """decide() of ``ck``'s model on the CPU emulation (a variant's kernel compiled on first use)."""
    cfg = ck.config

    def kernel(form: Variant) -> object:
        options = (*forward_layout(cfg, cluster_ranks(cfg, form)).options, *form.options())
        return emu.module("decide.cu", options).get_function("decide_kernel")

    return launcher(np, ck, kernel)


def test_the_variant_follows_the_rows_the_shape_and_the_device() -> None:
    cfg, small = ModelConfig(n_features=32), SMALL
    big = 1 << 20  # shared memory enough for every variant

    def variant(
        model: ModelConfig, rows: int, clusters: bool = True, shared: int = big, tensor_cores: bool = True
    ) -> Variant:
        return decide_variant(
            model, rows, multiprocessors=132, clusters=clusters, max_shared=shared, tensor_cores=tensor_cores
        )

    assert cluster_ranks(cfg, CLUSTER) == 4 and cluster_ranks(cfg, PAIR) == 2  # 8 heads, one group
    assert variant(cfg, 1) is CLUSTER
    assert variant(cfg, 16) is CLUSTER  # 64 blocks: at most half the multiprocessors
    assert variant(cfg, 17) is PAIR
    assert variant(cfg, 66) is PAIR  # 132 blocks: one wave
    assert variant(cfg, 67) is LATENCY
    assert variant(cfg, 132) is LATENCY  # one wave of one block a multiprocessor
    assert variant(cfg, 133) is TENSOR
    assert variant(cfg, 264, tensor_cores=False) is LATENCY  # without TF32 tensor cores: two waves
    assert variant(cfg, 265, tensor_cores=False) is THROUGHPUT
    assert variant(cfg, 1, clusters=False) is LATENCY  # no clusters on the device
    assert variant(cfg, 64, clusters=False) is LATENCY
    # Where the pair's staged share does not fit but the cluster's does: the next form that fits.
    assert variant(cfg, 17, shared=shared_bytes(cfg, CLUSTER)) is TENSOR
    assert variant(cfg, 1, shared=100 * 1024) is TENSOR  # no staged form fits
    assert variant(cfg, 1, shared=100 * 1024, tensor_cores=False) is THROUGHPUT
    single = ModelConfig(n_features=32, expand=1, headdim=64)  # one head: nothing to split
    assert cluster_ranks(single, CLUSTER) == 1
    assert variant(single, 1) is LATENCY
    assert cluster_ranks(small, CLUSTER) == 4  # 4 heads, 2 groups: a rank a head, two a group
    assert cluster_ranks(small, PAIR) == 2  # a rank a group
