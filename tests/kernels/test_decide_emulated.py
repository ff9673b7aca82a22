"""The whole-decision kernel (agent/kernels/decide.cu) against the chain of references on the
CPU emulation, in each forward variant: a batch with unhealthy, non-finite and padded rows
(tests/support/decide_chain.py); tests/gpu/test_kernels.py runs the same check on a device."""

from __future__ import annotations

from types import ModuleType
from typing import Literal

import numpy as np
import pytest

from agent.kernels.decide import decide, decide_variant, out_dtype
from agent.kernels.mamba_forward import (
    CLUSTER,
    LATENCY,
    PAIR,
    THROUGHPUT,
    VARIANTS,
    cluster_ranks,
    forward_layout,
    pack_params,
    shared_bytes,
)
from agent.model.config import ModelConfig
from agent.model.heads import c51_support, return_bin_centres
from tests.gpu.conftest import SMALL, make_checkpoint
from tests.support.decide_chain import DecideInputs, check_decision, decide_policy


@pytest.mark.parametrize(
    ("cfg", "variant", "selection"),
    [
        (ModelConfig(n_features=32), "cluster", "thompson"),
        (SMALL, "cluster", "greedy"),
        (ModelConfig(n_features=32), "pair", "greedy"),
        (SMALL, "latency", "thompson"),
        (SMALL, "throughput", "greedy"),
    ],
    ids=["cluster-default", "cluster-small", "pair-default", "latency-small", "throughput-small"],
)
def test_decide_matches_the_reference_chain(
    emu: ModuleType, cfg: ModelConfig, variant: str, selection: Literal["thompson", "greedy"]
) -> None:
    form = VARIANTS[variant]
    ranks = cluster_ranks(cfg, form)
    ck = make_checkpoint(cfg, seed=9, scale=3.0)
    policy, fee = decide_policy(selection), 0.5
    inputs = DecideInputs.draw(cfg, rows=16)
    window, bars, steps = inputs.window.copy(), inputs.bars.copy(), inputs.steps.copy()
    out = np.full((inputs.slots.size, out_dtype(cfg.n_actions).itemsize), 255, np.uint8)  # poisoned
    kernel = emu.module("decide.cu", (*forward_layout(cfg, ranks).options, *form.options())).get_function(
        "decide_kernel"
    )
    decide(
        pack_params(ck.params, cfg, ck.norm_mean, ck.norm_std, ranks),
        cfg,
        form,
        support=c51_support(cfg),
        centres32=return_bin_centres(cfg),
        centres64=return_bin_centres(cfg, np, np.float64),
        window=window,
        bars=bars,
        steps=steps,
        tick_value=inputs.ticks,
        rows=inputs.new,
        slots=inputs.slots,
        healthy=inputs.healthy.astype(np.uint8),
        positions=inputs.positions,
        regime=inputs.regime,
        policy=policy,
        fee_per_contract=fee,
        spread_column=cfg.n_features - 1,
        out=out,
        kernel=kernel,
    )
    check_decision(ck, cfg, inputs, out, window=window, bars=bars, steps=steps, policy=policy, fee=fee)


def test_the_variant_follows_the_rows_the_shape_and_the_device() -> None:
    cfg, small = ModelConfig(n_features=32), SMALL
    big = 1 << 20  # shared memory enough for every variant
    assert decide_variant(cfg, 1, clusters=True, max_shared=big) is CLUSTER
    assert decide_variant(cfg, 16, clusters=True, max_shared=big) is CLUSTER
    assert decide_variant(cfg, 17, clusters=True, max_shared=big) is PAIR
    assert decide_variant(cfg, 64, clusters=True, max_shared=big) is PAIR
    assert decide_variant(cfg, 65, clusters=True, max_shared=big) is THROUGHPUT
    assert decide_variant(cfg, 1, clusters=False, max_shared=big) is LATENCY  # no clusters on the device
    assert decide_variant(cfg, 64, clusters=False, max_shared=big) is LATENCY
    # The pair's staged share does not fit where the cluster's does: the next form that fits.
    assert decide_variant(cfg, 17, clusters=True, max_shared=shared_bytes(cfg, CLUSTER)) is THROUGHPUT
    assert decide_variant(cfg, 1, clusters=True, max_shared=100 * 1024) is THROUGHPUT  # no staged form fits
    single = ModelConfig(n_features=32, expand=1, headdim=64)  # one head: nothing to split
    assert cluster_ranks(single, CLUSTER) == 1
    assert decide_variant(single, 1, clusters=True, max_shared=big) is LATENCY
    assert cluster_ranks(cfg, CLUSTER) == 4 and cluster_ranks(cfg, PAIR) == 2  # 8 heads, one group
    assert cluster_ranks(small, CLUSTER) == 4  # 4 heads, 2 groups: a rank a head, two a group
    assert cluster_ranks(small, PAIR) == 2  # a rank a group
