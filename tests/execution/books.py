"""Hand-built MBP-10 records for execution tests (prices in ticks of 0.25 -> 1e-9 fixed point)."""

from __future__ import annotations

from typing import Any

import numpy as np

from feeds.records import ACTION_ADD, MBP10_DTYPE, MBP10_RTYPE, PRICE_SCALE, SIDE_NONE, UNDEF_PRICE

__all__ = ["TICK", "px", "record"]

TICK = PRICE_SCALE // 4
"""One tick of 0.25 in 1e-9 fixed point."""


def px(ticks: float) -> int:
    """A price ``4000 + ticks * 0.25`` in fixed point."""
    return 4000 * PRICE_SCALE + int(ticks * TICK)


def record(
    instrument_id: int,
    ts_ns: int,
    bids: list[tuple[int, int]],
    asks: list[tuple[int, int]],
    *,
    action: bytes = ACTION_ADD,
    price: int = UNDEF_PRICE,
    size: int = 0,
    sequence: int = 0,
) -> np.ndarray[Any, np.dtype[np.void]]:
    """One record (shape ``[1]``) whose book has the given (price, size) levels, best first."""
    rec = np.zeros(1, dtype=MBP10_DTYPE)
    rec["length"] = MBP10_DTYPE.itemsize // 4
    rec["rtype"] = MBP10_RTYPE
    rec["instrument_id"] = instrument_id
    rec["ts_event"] = ts_ns
    rec["ts_recv"] = ts_ns
    rec["action"] = action
    rec["side"] = SIDE_NONE
    rec["price"] = price
    rec["size"] = size
    rec["sequence"] = sequence
    for i in range(10):
        for name, levels in (("bid", bids), ("ask", asks)):
            p, s = levels[i] if i < len(levels) else (UNDEF_PRICE, 0)
            rec[f"{name}_px_{i:02d}"] = p
            rec[f"{name}_sz_{i:02d}"] = s
    return rec
