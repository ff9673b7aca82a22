"""A whole decision per thread block on the device: ``decide()`` (``decide.cu``).

Window push -> fused Mamba2 forward -> C51 and return-head moments -> action choice
(``policy.selection``: Thompson, or the greedy best expected Q) -> Kelly x regime size, for one
row per block: one kernel launch decides a batch. The forward, the moments, Thompson and Kelly
are the device functions that the per-stage kernels (``mamba_forward``, ``softmax_ev``,
``thompson``, ``kelly``) test against their NumPy references; the whole chain's reference is the
references run in the same order, as the CPU engine (:mod:`agent.gpu.cpu_runner`) runs them,
with ``window_push_ref`` for the push.

Results come back as one record per row (:func:`out_dtype`), so that the host reads a batch
with one copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.kernels.kelly import kelly_policy_args
from agent.kernels.mamba_forward import (
    CLUSTER,
    LATENCY,
    PAIR,
    THROUGHPUT,
    Variant,
    cluster_ranks,
    compiled,
    shared_bytes,
)
from agent.model.config import ModelConfig
from agent.policy.config import PolicyConfig
from agent.policy.philox import Purpose

__all__ = ["CLUSTER_ROWS", "LATENCY_ROWS", "PAIR_ROWS", "decide", "decide_variant", "out_dtype"]


def out_dtype(n_actions: int) -> np.dtype[Any]:
    """One row of the kernel's output (``DecideOut`` in ``decide.cu``, same C layout)."""
    return np.dtype(
        [
            ("f_star", np.float64),
            ("size", np.float64),
            ("regime_scale", np.float64),
            ("step", np.uint64),
            ("start_ns", np.uint64),
            ("end_ns", np.uint64),
            ("q", np.float32, (n_actions,)),
            ("ret_mean", np.float32),
            ("ret_var", np.float32),
            ("action", np.int32),
            ("target", np.int32),
            ("direction", np.int8),
            ("valid", np.bool_),
        ],
        align=True,
    )


CLUSTER_ROWS = 16
"""Launches of up to this many rows run the cluster variant where the device has clusters."""
PAIR_ROWS = 64
"""Up to this many, the pair variant (on the H200, 32 rows on clusters of four took 50 us of
device time, on pairs 35 us: four times the rows' blocks were no longer resident at once)."""
LATENCY_ROWS = 64
"""Up to this many, the latency variant (one block a multiprocessor: the H200's 132 hold 64
windows in one wave); larger launches the throughput variant."""


def decide_variant(cfg: ModelConfig, rows: int, *, clusters: bool, max_shared: int) -> Variant:
    """The forward variant for a launch of ``rows`` rows: on a device with thread-block
    clusters (``clusters``), up to :data:`CLUSTER_ROWS` rows the cluster variant and up to
    :data:`PAIR_ROWS` the pair variant (where the model splits over more than one rank); up to
    :data:`LATENCY_ROWS` the latency variant; each only where its staged weights fit in
    ``max_shared`` bytes of shared memory a block. Else the throughput variant."""
    forms: list[tuple[int, Variant]] = [(CLUSTER_ROWS, CLUSTER), (PAIR_ROWS, PAIR)] if clusters else []
    for limit, variant in [*forms, (LATENCY_ROWS, LATENCY)]:
        divides = not variant.split or cluster_ranks(cfg, variant) > 1
        if rows <= limit and divides and shared_bytes(cfg, variant) <= max_shared:
            return variant
    return THROUGHPUT


def decide(
    packed: Any,
    cfg: ModelConfig,
    variant: Variant,
    *,
    support: Any,
    centres32: Any,
    centres64: Any,
    window: Any,
    bars: Any,
    steps: Any,
    tick_value: Any,
    rows: Any,
    slots: Any,
    healthy: Any,
    positions: Any,
    regime: Any,
    policy: PolicyConfig,
    fee_per_contract: float,
    spread_column: int,
    out: Any,
    kernel: Any = None,
) -> None:
    """Launch one decision per row on the current stream (CuPy arrays, see ``decide.cu``).

    packed (total,) float32 from :func:`agent.kernels.mamba_forward.pack_params` (with the
    variant's :func:`agent.kernels.mamba_forward.cluster_ranks`); support
    (atoms,) float32; centres32/centres64 (bins,) return-bin centres in ticks. Per slot:
    window (S, K, F) float32 raw features, bars and steps (S,) uint64 counters of rows pushed
    and decisions made (all three updated in place), tick_value (S,) float64. Per row: rows
    (B, F) float32; slots (B,) int32 distinct (negative: padded row, left unwritten);
    healthy (B,) bool or uint8; positions (B,) int32; regime (B,) float32. Sizing's cost gate
    charges ``fee_per_contract`` a leg and half the spread in column ``spread_column`` of the
    row (:func:`agent.policy.kelly.leg_cost`). out (B, itemsize)
    uint8: one record of :func:`out_dtype` a row (CuPy has no structured dtypes; the host views
    the same bytes as records). ``kernel``: what to launch, called as a ``cupy.RawKernel``
    (default ``decide_kernel`` compiled for ``cfg`` and ``variant``; the tests pass the CPU
    emulation's, with NumPy arrays).
    """
    n = slots.shape[0]
    if kernel is None:
        fn, shared = compiled("decide.cu", "decide_kernel", cfg, variant)
    else:
        fn, shared = kernel, shared_bytes(cfg, variant)
    if n:
        fn(
            (n * cluster_ranks(cfg, variant),),
            (variant.threads,),
            (
                packed,
                support,
                centres32,
                centres64,
                window,
                bars,
                steps,
                tick_value,
                rows,
                slots,
                healthy,
                positions,
                regime,
                np.int32(policy.selection == "greedy"),
                np.uint64(policy.seed),
                np.uint32(int(Purpose.THOMPSON)),
                *kelly_policy_args(policy, fee_per_contract),
                np.int32(spread_column),
                out,
            ),
            shared_mem=shared,
        )
