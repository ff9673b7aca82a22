"""Window push: ``window_push()`` (``window_push.cu``) and ``window_push_ref()``.

Each instrument or environment slot owns a (K, F) window of raw feature rows, oldest first.
A push shifts the slot's window left by one bar and writes the new row at K-1, for the valid
rows of a batch only: a row is valid when its instrument is healthy and every feature is
finite; an invalid row leaves its window untouched (it never reaches the model).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from agent.kernels.loader import cupy, kernel

__all__ = ["window_push", "window_push_ref"]

_THREADS = 128


def window_push_ref(
    window: npt.NDArray[np.float32],
    rows: npt.ArrayLike,
    slots: npt.ArrayLike,
    healthy: npt.ArrayLike,
) -> npt.NDArray[np.bool_]:
    """Push in place. window (S, K, F) float32; rows (B, F); slots (B,) distinct ints in [0, S)
    (negative = padded row, ignored); healthy (B,) bool. Returns valid (B,) bool."""
    r = np.asarray(rows, dtype=np.float32)
    s = np.asarray(slots, dtype=np.int64)
    valid = np.asarray(healthy, dtype=bool) & np.isfinite(r).all(axis=1) & (s >= 0)
    target = s[valid]
    window[target, :-1] = window[target, 1:]
    window[target, -1] = r[valid]
    return valid


def window_push(window: Any, rows: Any, slots: Any, healthy: Any, *, valid: Any = None) -> Any:
    """Device version (CuPy), in place: window (S, K, F) float32, rows (B, F) float32, slots (B,)
    int32, healthy (B,) uint8. Returns valid (B,) uint8 (rows with a negative slot: unwritten)."""
    cp = cupy()
    n_rows, n_features = rows.shape
    _, k, f = window.shape
    if f != n_features:
        raise ValueError(f"window has {f} features per bar, rows have {n_features}")
    valid = cp.empty(n_rows, dtype=cp.uint8) if valid is None else valid
    if n_rows:
        kernel("window_push.cu", "window_push_kernel")(
            (n_rows,),
            (_THREADS,),
            (window, rows, slots, healthy, cp.int32(k), cp.int32(f), valid),
            shared_mem=(k - 1) * f * 4,
        )
    return valid
