"""The sufficient statistics of closed bars, shared by both paths, and the book at the close.

Both paths reduce a bar's records to the same integers, :class:`BarStatistics`, and the
features are functions of those alone (:mod:`feeds.features.definitions`). The record rules
that feed the statistics are written once over operands that are Python ints (one record) or
int64 arrays (many): :func:`feeds.health.fault_mask` and :func:`ofi_price_term`; the book at the
close is reduced to :data:`BOOK_INTS` by one array function, :func:`book_at_close`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from feeds.config import HealthConfig
from feeds.errors import FeedError
from feeds.records import LEVELS, MBP10_DTYPE, UNDEF_PRICE

__all__ = [
    "BOOK",
    "BOOK_INTS",
    "DEPTH_LEVELS",
    "BarStatistics",
    "book_at_close",
    "check_records",
    "ofi_price_term",
    "stale_interval_ns",
]

DEPTH_LEVELS = (1, 3, 5, 10)
"""The levels ``k`` whose summed sizes (levels 1..k) a bar keeps of its book."""
BOOK_INTS: tuple[str, ...] = (
    "bid",
    "ask",
    "bid_size",
    "ask_size",
    *(f"bid_depth_l{k}" for k in DEPTH_LEVELS),
    *(f"ask_depth_l{k}" for k in DEPTH_LEVELS),
)
"""What a bar keeps of the book at its close: best prices (fixed point), best sizes and the
sizes summed over levels 1..k (contracts); all zero before the first healthy record."""
BOOK = {name: i for i, name in enumerate(BOOK_INTS)}
"""The column of each of :data:`BOOK_INTS` in :attr:`BarStatistics.book`."""


@dataclasses.dataclass(frozen=True, slots=True)
class BarStatistics:
    """The sufficient statistics of ``n`` closed bars, in close order: all the features need.

    Every field is int64 ``(n,)`` unless said otherwise. A feature names the fields it reads
    (:attr:`feeds.features.definitions.Feature.needs`); a new statistic is a new field here,
    computed by both paths (:func:`feeds.features.group_statistics.bar_statistics` over arrays,
    :class:`feeds.features.incremental.IncrementalBars` record by record).
    """

    close_ts: np.ndarray
    """This close, UNIX ns."""
    close_ts_before: np.ndarray
    """The previous close (the first bar of the stream: its own close)."""
    mid2: np.ndarray
    """Best bid + best ask (fixed point) of the last healthy record at this close (0: none yet)."""
    mid2_before: np.ndarray
    """:attr:`mid2` at the previous close (0: none)."""
    book: np.ndarray
    """:data:`BOOK_INTS` at the close, ``(n, len(BOOK_INTS))`` (columns: :data:`BOOK`)."""
    signed_volume: np.ndarray
    """Traded contracts, + buyer-initiated (side bid), - seller-initiated."""
    volume: np.ndarray
    """Traded contracts."""
    trades: np.ndarray
    """Trade records."""
    rv_half_ticks2: np.ndarray
    """Sum over the bar of the squared record-to-record change of :attr:`mid2` in ticks (twice
    the mid in ticks), healthy records only."""
    ofi: np.ndarray
    """Order-flow imbalance per level, ``(n, LEVELS)`` contracts (:func:`ofi_price_term`)."""
    n_records: np.ndarray
    """Records in the bar."""
    close_index: np.ndarray
    """Index of the instrument's last record at or before the close (-1: none)."""
    tradable: np.ndarray
    """bool: no record of the bar failed a check, the last one is healthy, the feed was not
    stale at the close and no transport gap was reported in the bar."""
    tick: Any
    """The instrument's tick (fixed point) of each bar: an int (one instrument) or int64 ``(n,)``."""


_DEPTH_ROWS = [k - 1 for k in DEPTH_LEVELS]
assert BOOK_INTS[4:] == tuple(f"{side}_depth_l{k}" for side in ("bid", "ask") for k in DEPTH_LEVELS)


def book_at_close(
    bid: np.ndarray, ask: np.ndarray, bid_sizes: np.ndarray, ask_sizes: np.ndarray
) -> np.ndarray:
    """:data:`BOOK_INTS` of ``n`` books, int64 ``(n, len(BOOK_INTS))``, from their best prices
    (``(n,)``) and level sizes (contracts, level-major ``(LEVELS, n)``); both paths use it."""
    n = bid.shape[0]
    depth = np.empty((LEVELS, 2, n), np.int64)  # level-major: bid, ask contracts
    depth[:, 0] = bid_sizes
    depth[:, 1] = ask_sizes
    for k in range(1, LEVELS):  # summed over levels 1..k+1: whole-array adds (cumsum along a
        depth[k] += depth[k - 1]  # short axis is slower)
    out = np.empty((n, len(BOOK_INTS)), np.int64)
    out[:, 0] = bid
    out[:, 1] = ask
    out[:, 2:4] = depth[0].T
    out[:, 4:].reshape(n, 2, len(_DEPTH_ROWS))[:] = depth[_DEPTH_ROWS].transpose(2, 1, 0)
    return out


def ofi_price_term(p1: Any, p0: Any, q1: Any, q0: Any, *, bid: bool) -> Any:
    """The part of one level's order-flow term that a price change adds to the size change.

    Per record ``i`` and level ``m`` (Cont, Kukanov and Stoikov 2014; Xu, Gould and Howison
    2018), with ``b, qb`` the bid price and size at level ``m`` and ``a, qa`` the ask:

        e_i = qb_i 1[b_i >= b_i-1] - qb_i-1 1[b_i <= b_i-1]
              - qa_i 1[a_i <= a_i-1] + qa_i-1 1[a_i >= a_i-1]

    With ``p0, q0`` a level's price and size before a record and ``p1, q1`` after it, the
    level's term is ``(q1 - q0) + ofi_price_term(...)`` on the bid side and ``-(q1 - q0) +
    ofi_price_term(...)`` on the ask side. Operands are Python ints or int64 arrays (both paths
    use this one definition). An empty bid level (``UNDEF_PRICE``) is the lowest price; an
    empty ask level is the highest, as ``UNDEF_PRICE`` already is.
    """
    if bid:
        up = (p1 != p0) & ((p0 == UNDEF_PRICE) | ((p1 != UNDEF_PRICE) & (p1 > p0)))
        down = (p1 != p0) & (up ^ True)
        return up * q0 - down * q1
    return (p1 > p0) * q1 - (p1 < p0) * q0


def check_records(records: np.ndarray) -> None:
    """Raise :class:`FeedError` unless ``records`` is what both paths take: a 1-D array of
    :data:`feeds.records.MBP10_DTYPE`."""
    if not isinstance(records, np.ndarray) or records.dtype != MBP10_DTYPE or records.ndim != 1:
        raise FeedError("expected a 1-D array of MBP-10 records (feeds.records.MBP10_DTYPE)")


def stale_interval_ns(health: HealthConfig) -> int:
    """``feeds.health.stale_after_s`` in ns; raises :class:`FeedError` when it is not positive."""
    if not health.stale_after_s > 0:
        raise FeedError(f"feeds.health.stale_after_s must be positive, got {health.stale_after_s!r}")
    return round(health.stale_after_s * 1e9)
