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
    TENSOR,
    THROUGHPUT,
    Variant,
    cluster_ranks,
    compiled,
    shared_bytes,
)
from agent.model.config import ModelConfig
from agent.policy.config import PolicyConfig
from agent.policy.philox import Purpose

__all__ = ["RING_STALE", "decide", "decide_variant", "out_dtype", "ring_shape"]


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


RING_STALE = np.uint64(2**64 - 1)
"""A ``cached`` value no slot's row count reaches: the slot's ring is computed afresh."""


def ring_shape(cfg: ModelConfig, slots: int) -> tuple[int, int, int]:
    """The shape of a model's ring of cached rows (``decide()``'s ``cache``): per slot and window
    step, the first layer's per-row work (``MF_CW`` floats: the embedding's output, then in_proj's
    over the whole model's columns, padded to a multiple of 4)."""
    return slots, cfg.window, cfg.d_model + -(-cfg.in_proj_dim // 4) * 4


def decide_variant(
    cfg: ModelConfig,
    rows: int,
    *,
    multiprocessors: int,
    clusters: bool,
    max_shared: int,
    tensor_cores: bool,
) -> Variant:
    """The forward variant for a launch of ``rows`` rows on a device of ``multiprocessors``
    multiprocessors, with thread-block clusters or not (``clusters``), ``max_shared`` bytes of
    shared memory a block and TF32 tensor cores or not (``tensor_cores``). Where the device has
    clusters and the model splits over more than one rank: the cluster variant while its blocks
    take at most half the multiprocessors (a cluster of four needs four of one GPC: the H200 held
    30 such clusters at once, not 33), the pair variant while its blocks take at most all of them
    (one wave). Else the latency variant while its blocks (one a multiprocessor) fill one wave
    on a device with tensor cores, two without, and above that the throughput form: on the
    tensor cores where the device has them. A staged form only where its weights fit in
    ``max_shared``.

    Measured on the H200 (132 multiprocessors), device time of each variant side by side: 32
    rows 50.5 us on clusters of four, 34.7 on pairs; 128 rows 42.6 us latency, 70.8 pairs, 84.1
    throughput; 256 rows 80.0 latency, 88.1 throughput; 512 rows 151.3 latency, 112.4
    throughput. With the tensor-core form (another run): 132 rows 41.0 latency, 47.4 tensor;
    133 rows 68.4 latency, 51.4 tensor, 75.8 throughput; 4,096 rows 569.2 tensor, 726.5
    throughput."""
    forms = [(multiprocessors // 2, CLUSTER), (multiprocessors, PAIR)] if clusters else []
    for blocks, variant in forms:
        ranks = cluster_ranks(cfg, variant)
        if ranks > 1 and rows * ranks <= blocks and shared_bytes(cfg, variant) <= max_shared:
            return variant
    waves = 1 if tensor_cores else 2
    if rows <= waves * multiprocessors and shared_bytes(cfg, LATENCY) <= max_shared:
        return LATENCY
    return TENSOR if tensor_cores else THROUGHPUT


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
    cache: Any,
    cached: Any,
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
    and decisions made (all three updated in place), tick_value (S,) float64. The model's, per
    slot (updated in place): cache (:func:`ring_shape`) float32, the ring of the first layer's
    per-row work, and cached (S,) uint64, the rows pushed when the ring last held the window
    (fill with :data:`RING_STALE` for a new model: each slot's first decision computes its ring;
    a row's values are the same bits in every variant). Per row: rows
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
                cache,
                cached,
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
