"""Philox4x32-10 on the device: ``philox4x32()`` (``philox.cu``) and its reference
``philox4x32_ref`` (:func:`agent.policy.philox.philox4x32`)."""

from __future__ import annotations

from typing import Any

from agent.kernels.loader import cupy, kernel
from agent.policy.philox import philox4x32 as philox4x32_ref

__all__ = ["philox4x32", "philox4x32_ref"]


def philox4x32(counters: Any, keys: Any) -> Any:
    """Philox4x32-10 of (n, 4) uint32 counters under (n, 2) uint32 keys (CuPy) -> (n, 4) uint32."""
    cp = cupy()
    ctr = cp.ascontiguousarray(counters, dtype=cp.uint32)
    key = cp.ascontiguousarray(keys, dtype=cp.uint32)
    n = ctr.shape[0]
    if ctr.shape != (n, 4) or key.shape != (n, 2):
        raise ValueError(f"philox4x32 wants (n, 4) counters and (n, 2) keys, got {ctr.shape}, {key.shape}")
    out = cp.empty((n, 4), dtype=cp.uint32)
    if n:
        kernel("philox.cu", "philox4x32_kernel")(((n + 127) // 128,), (128,), (ctr, key, out, cp.int32(n)))
    return out
