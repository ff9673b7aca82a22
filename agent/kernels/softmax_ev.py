"""Row softmax with the expectation and variance of a support: ``softmax_ev()``
(``softmax_ev.cu``) and ``softmax_ev_ref()``.

Serves both heads: C51 (rows = B x A, support = the atoms; the mean is Q) and the return head
(rows = B, support = the bin centres in ticks; mean and variance of the next move).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from agent.kernels.loader import cupy, kernel
from agent.model.ops import softmax

__all__ = ["MAX_SUPPORT", "softmax_ev", "softmax_ev_ref"]

MAX_SUPPORT = 128
"""Longest row the kernel handles (one warp, four entries a lane)."""
_WARPS_PER_BLOCK = 4


def softmax_ev_ref(
    logits: npt.ArrayLike, support: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Reference in float64: logits (R, N), support (N,) -> probs (R, N), mean (R,), var (R,)."""
    p = softmax(np.asarray(logits, dtype=np.float64), axis=-1)
    z = np.asarray(support, dtype=np.float64)
    mean = p @ z
    var = np.maximum(p @ (z * z) - mean * mean, 0.0)
    return p, mean, var


def softmax_ev(
    logits: Any, support: Any, *, probs: Any = None, mean: Any = None, var: Any = None
) -> tuple[Any, Any, Any]:
    """Device version (CuPy): logits (R, N) float32, support (N,) float32, N <= 128.

    Returns float32 (probs (R, N), mean (R,), var (R,)); outputs may be preallocated.
    """
    cp = cupy()
    rows, n = logits.shape
    if n > MAX_SUPPORT or support.shape != (n,):
        raise ValueError(
            f"softmax_ev wants logits (R, N<={MAX_SUPPORT}) and support (N,), got {logits.shape}"
        )
    probs = cp.empty((rows, n), dtype=cp.float32) if probs is None else probs
    mean = cp.empty(rows, dtype=cp.float32) if mean is None else mean
    var = cp.empty(rows, dtype=cp.float32) if var is None else var
    blocks = (rows + _WARPS_PER_BLOCK - 1) // _WARPS_PER_BLOCK
    kernel("softmax_ev.cu", "softmax_ev_kernel")(
        (blocks,),
        (32 * _WARPS_PER_BLOCK,),
        (logits, support, cp.int32(rows), cp.int32(n), probs, mean, var),
    )
    return probs, mean, var
