"""Thompson action choice on the device: ``thompson()`` (``thompson.cu``) and its reference
``thompson_ref`` (:func:`agent.policy.thompson.thompson_ref`, the CPU path).

The kernel is compiled with ``--fmad=false``: the float32 CDF and threshold are computed with
the same operations in the same order as the reference, so identical probabilities give
identical actions.
"""

from __future__ import annotations

from typing import Any

from agent.kernels.loader import cupy, kernel
from agent.policy.philox import Purpose
from agent.policy.thompson import MAX_ACTIONS, thompson_ref

__all__ = ["thompson", "thompson_ref"]

_OPTIONS = ("--fmad=false",)
_WARPS = 4
"""Rows per thread block (one warp a row)."""


def thompson(
    probs: Any,
    support: Any,
    seed: int,
    env: Any,
    step: Any,
    *,
    action: Any = None,
    value: Any = None,
) -> tuple[Any, Any]:
    """Draw one atom per action by inverse CDF with Philox and pick the argmax (CuPy arrays).

    Args:
        probs: (B, A, N) float32 probabilities, A <= 4.
        support: (N,) float32 atom values.
        seed: Philox key.
        env: (B,) int32 slot of each row; a negative slot marks a padded row (left unwritten).
        step: (B,) uint64 decision index of each row.
        action, value: optional preallocated outputs (B,) int32 and (B, A) float32.

    Returns:
        (action (B,) int32, value (B, A) float32): as :func:`thompson_ref`.
    """
    cp = cupy()
    rows, n_actions, n_atoms = probs.shape
    if not 1 <= n_actions <= MAX_ACTIONS or support.shape != (n_atoms,):
        raise ValueError(f"thompson wants probs (B, A<={MAX_ACTIONS}, N) and support (N,), got {probs.shape}")
    action = cp.empty(rows, dtype=cp.int32) if action is None else action
    value = cp.empty((rows, n_actions), dtype=cp.float32) if value is None else value
    kernel("thompson.cu", "thompson_kernel", options=_OPTIONS)(
        ((rows + _WARPS - 1) // _WARPS,),
        (32 * _WARPS,),
        (
            probs,
            support,
            env,
            step,
            cp.uint64(seed),
            cp.uint32(int(Purpose.THOMPSON)),
            cp.int32(rows),
            cp.int32(n_actions),
            cp.int32(n_atoms),
            action,
            value,
        ),
        shared_mem=_WARPS * n_actions * n_atoms * 4,
    )
    return action, value
