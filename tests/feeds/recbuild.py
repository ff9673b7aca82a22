"""Build MBP-10 record arrays for the book, health, bar and feature tests.

:func:`book_records` turns a compact description (one :class:`Row` per record: top of book in
ticks, an action) into real :data:`feeds.records.MBP10_DTYPE` records; deeper levels step one
tick away from the top. :func:`random_book` makes a large random-walk book quickly (vectorised),
with adds, cancels, modifies and trades, for parity and speed checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from feeds.records import (
    ACTION_ADD,
    ACTION_CANCEL,
    ACTION_MODIFY,
    ACTION_TRADE,
    LEVELS,
    MBP10_DTYPE,
    MBP10_RTYPE,
    PRICE_SCALE,
    SIDE_ASK,
    SIDE_BID,
    SIDE_NONE,
    UNDEF_PRICE,
)

__all__ = ["TICK", "Row", "book_records", "random_book"]

TICK = 0.25
_TICK_FIXED = round(TICK * PRICE_SCALE)
T0 = 1_700_000_000_000_000_000  # a UNIX ns epoch on a whole second


@dataclasses.dataclass(frozen=True)
class Row:
    """One record: ``ts`` ns after :data:`T0`; ``bid``/``ask`` in ticks (``None``: side empty)."""

    ts: int
    bid: int | None = 4000
    ask: int | None = 4001
    bid_sz: int = 10
    ask_sz: int = 10
    action: bytes = ACTION_ADD
    side: bytes = SIDE_BID
    price: int | None = None
    """Event price in ticks (trades); ``None`` = the best price of ``side``."""
    size: int = 1
    seq: int | None = None


def book_records(rows: Sequence[Row], instrument_id: int = 1001) -> np.ndarray:
    """Records of ``rows`` in order (sequence numbers 1, 2, ... unless given)."""
    out = np.zeros(len(rows), dtype=MBP10_DTYPE)
    out["length"] = MBP10_DTYPE.itemsize // 4
    out["rtype"] = MBP10_RTYPE
    out["publisher_id"] = 1
    out["instrument_id"] = instrument_id
    for i, row in enumerate(rows):
        rec = out[i : i + 1]
        rec["ts_recv"] = T0 + row.ts
        rec["ts_event"] = T0 + row.ts - 1000
        rec["sequence"] = row.seq if row.seq is not None else i + 1
        rec["action"] = row.action
        rec["side"] = row.side
        rec["size"] = row.size
        best = row.bid if row.side == SIDE_BID else row.ask
        price = row.price if row.price is not None else best
        rec["price"] = UNDEF_PRICE if price is None else price * _TICK_FIXED
        for k in range(LEVELS):
            if row.bid is None:
                rec[f"bid_px_{k:02d}"], rec[f"bid_sz_{k:02d}"] = UNDEF_PRICE, 0
            else:
                rec[f"bid_px_{k:02d}"] = (row.bid - k) * _TICK_FIXED
                rec[f"bid_sz_{k:02d}"] = row.bid_sz + k
                rec[f"bid_ct_{k:02d}"] = 1
            if row.ask is None:
                rec[f"ask_px_{k:02d}"], rec[f"ask_sz_{k:02d}"] = UNDEF_PRICE, 0
            else:
                rec[f"ask_px_{k:02d}"] = (row.ask + k) * _TICK_FIXED
                rec[f"ask_sz_{k:02d}"] = row.ask_sz + 2 * k
                rec[f"ask_ct_{k:02d}"] = 1
    return out


def random_book(n: int, seed: int = 0, instrument_id: int = 1001, mean_gap_ns: int = 2_000_000) -> np.ndarray:
    """``n`` records of a random-walk book (ticks of :data:`TICK`) shaped like real MBP-10 data:
    each record changes the size of one level of one side; about 3% move the top of book (the
    ladder shifts), the spread is 1 tick or, in stretches, 2; about 8% are trades. Inter-arrival
    times are exponential with mean ``mean_gap_ns``, from :data:`T0`."""
    rng = np.random.default_rng(seed)
    out = np.zeros(n, dtype=MBP10_DTYPE)
    out["length"] = MBP10_DTYPE.itemsize // 4
    out["rtype"] = MBP10_RTYPE
    out["publisher_id"] = 1
    out["instrument_id"] = instrument_id
    ts = T0 + np.cumsum(rng.exponential(mean_gap_ns, n).astype(np.int64) + 1)
    out["ts_recv"] = ts
    out["ts_event"] = ts - 500
    out["sequence"] = np.arange(1, n + 1)
    moves = np.where(rng.random(n) < 0.03, rng.choice([-1, 1], n), 0)
    bid = 16000 + np.cumsum(moves)
    wide = np.cumsum(rng.random(n) < 0.002) % 2 == 1
    ask = bid + 1 + wide
    kind = rng.choice(4, n, p=[0.42, 0.35, 0.15, 0.08])
    actions = np.array([ACTION_ADD, ACTION_CANCEL, ACTION_MODIFY, ACTION_TRADE], dtype="S1")
    out["action"] = actions[kind]
    sides = np.where(rng.random(n) < 0.5, SIDE_BID, SIDE_ASK).astype("S1")
    sides[rng.random(n) < 0.02] = SIDE_NONE
    out["side"] = sides
    out["size"] = rng.integers(1, 20, n)
    out["price"] = np.where(sides == SIDE_BID, bid, ask) * _TICK_FIXED
    # one level of one side changes size per record: a bounded random walk per queue
    delta = np.zeros((n, 2 * LEVELS), dtype=np.int64)
    delta[np.arange(n), rng.integers(0, 2 * LEVELS, n)] = rng.integers(-5, 6, n)
    sizes = np.clip(100 + np.cumsum(delta, axis=0), 1, None)
    for k in range(LEVELS):
        out[f"bid_px_{k:02d}"] = (bid - k) * _TICK_FIXED
        out[f"ask_px_{k:02d}"] = (ask + k) * _TICK_FIXED
        out[f"bid_sz_{k:02d}"] = sizes[:, k]
        out[f"ask_sz_{k:02d}"] = sizes[:, LEVELS + k]
        out[f"bid_ct_{k:02d}"] = 1
        out[f"ask_ct_{k:02d}"] = 1
    return out
