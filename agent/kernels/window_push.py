"""Window push: ``window_push_ref()``, the reference of the push at the start of
``decide.cu`` (the engine's kernel) and the CPU engine's own push.

Each instrument or environment slot owns a (K, F) window of raw feature rows, oldest first.
A push shifts the slot's window left by one bar and writes the new row at K-1, for the valid
rows of a batch only: a row is valid when its instrument is healthy and every feature is
finite; an invalid row leaves its window untouched (it never reaches the model).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["window_push_ref"]


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
