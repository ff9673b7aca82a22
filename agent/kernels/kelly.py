"""Kelly sizing on the device: ``kelly_size()`` (``kelly.cu``) and its reference
``kelly_size_ref`` (:func:`agent.policy.kelly.kelly_size_ref`, the CPU path).

The kernel runs the same safeguarded Newton in float64; f* agrees with the reference to
~1e-12 relative, so targets agree except where ``size * scale * max_contracts`` lies within
rounding of an integer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.kernels.loader import cupy, kernel
from agent.policy.config import PolicyConfig
from agent.policy.kelly import kelly_size_ref

__all__ = ["MAX_BINS", "kelly_launch", "kelly_policy_args", "kelly_size", "kelly_size_ref"]

MAX_BINS = 64
_WARPS = 4
"""Rows per thread block (one warp a row)."""


def kelly_policy_args(policy: PolicyConfig, fee_per_contract: float) -> tuple[Any, ...]:
    """The kernel arguments that ``kelly.cuh``'s ``KellyPolicy`` is built from: capital per
    contract, fee a leg, minimum edge in ticks, Kelly fraction, regime scale floor, contracts."""
    return (
        np.float64(policy.capital_per_contract),
        np.float64(fee_per_contract),
        np.float64(policy.min_edge_ticks),
        np.float64(policy.kelly_fraction),
        np.float64(policy.scale_floor),
        np.int32(policy.max_contracts),
    )


def kelly_launch(
    ret_probs: Any,
    bin_ticks: Any,
    *,
    dir_src: Any,
    dir_offset: int,
    slots: Any,
    tick_value: Any,
    regime: Any,
    valid: Any,
    positions: Any,
    spread: Any,
    policy: PolicyConfig,
    fee_per_contract: float,
    target: Any,
    size: Any,
    f_star: Any,
    mean_return: Any,
) -> None:
    """Launch ``kelly_kernel`` on preallocated arrays (the engine's form; see ``kelly.cu``).

    ret_probs (B, bins) float32, bin_ticks (bins,) float64, dir_src (B,) int32 (direction =
    dir_src - dir_offset), slots (B,) int32 (negative: skipped), tick_value (S,) float64 by
    slot, regime (B,) float32, valid (B,) uint8, positions (B,) int32 (kept where not valid).
    """
    cp = cupy()
    rows, bins = ret_probs.shape
    if bins > MAX_BINS:
        raise ValueError(f"kelly_size handles at most {MAX_BINS} return bins, got {bins}")
    kernel("kelly.cu", "kelly_kernel", options=("--fmad=false",))(
        ((rows + _WARPS - 1) // _WARPS,),
        (32 * _WARPS,),
        (
            ret_probs,
            bin_ticks,
            cp.int32(bins),
            dir_src,
            cp.int32(dir_offset),
            slots,
            tick_value,
            regime,
            valid,
            positions,
            spread,
            cp.int32(spread.strides[0] // spread.itemsize),
            cp.int32(rows),
            *kelly_policy_args(policy, fee_per_contract),
            target,
            size,
            f_star,
            mean_return,
        ),
    )


def kelly_size(
    ret_probs: Any,
    bin_ticks: Any,
    direction: Any,
    tick_value: Any,
    regime_scale: Any,
    *,
    spread_ticks: Any,
    position: Any,
    policy: PolicyConfig,
    fee_per_contract: float,
) -> tuple[Any, Any, Any, Any]:
    """Device twin of :func:`kelly_size_ref` on CuPy arrays of the same shapes.

    Returns (target (B,) int32, size, f_star, mean_return (B,) float64).
    """
    cp = cupy()
    rows = ret_probs.shape[0]
    target = cp.empty(rows, dtype=cp.int32)
    size, f_star, mean_return = (cp.empty(rows, dtype=cp.float64) for _ in range(3))
    kelly_launch(
        cp.ascontiguousarray(ret_probs, dtype=cp.float32),
        cp.ascontiguousarray(bin_ticks, dtype=cp.float64),
        dir_src=cp.ascontiguousarray(direction, dtype=cp.int32),
        dir_offset=0,
        slots=cp.arange(rows, dtype=cp.int32),
        tick_value=cp.ascontiguousarray(tick_value, dtype=cp.float64),
        regime=cp.ascontiguousarray(regime_scale, dtype=cp.float32),
        valid=cp.ones(rows, dtype=cp.uint8),
        positions=cp.ascontiguousarray(position, dtype=cp.int32),
        spread=cp.ascontiguousarray(spread_ticks, dtype=cp.float32).reshape(rows, 1),
        policy=policy,
        fee_per_contract=fee_per_contract,
        target=target,
        size=size,
        f_star=f_star,
        mean_return=mean_return,
    )
    return target, size, f_star, mean_return
