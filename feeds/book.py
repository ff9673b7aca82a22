"""The per-instrument order book as MBP-10 records carry it.

An MBP-10 record holds the 10 bid and ask levels *after* its event, so the book of an instrument
at any moment is simply the levels of its last record: there is nothing to rebuild. This module
gives zero-copy views of those levels over a record array (for the vectorised paths) and
:class:`BookSnapshot`, a plain copy of one record's book for live consumers. The book features
(spread, microprice, depth imbalance) are defined in :mod:`feeds.features`.

Conventions
-----------
* Prices are Databento 1e-9 fixed-point integers (:data:`feeds.records.PRICE_SCALE`); a missing
  level has price :data:`feeds.records.UNDEF_PRICE` and size 0. Integer prices are converted to
  ticks only here, with ``tick_fixed = round(tick_size * PRICE_SCALE)``.
* Level arrays have shape ``(n, LEVELS)``; column 0 is the top of book.
* Trades are the records with ``action == b"T"``; their ``side`` is the aggressor
  (``b"B"``: a buyer lifted the ask, ``b"A"``: a seller hit the bid, ``b"N"``: unknown).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from feeds.errors import FeedError
from feeds.records import LEVELS, MBP10_DTYPE, PRICE_SCALE, UNDEF_PRICE

__all__ = [
    "LEVEL_DTYPE",
    "BookSnapshot",
    "Levels",
    "level_arrays",
    "levels_at",
    "tick_fixed",
]

LEVEL_DTYPE = np.dtype(
    [
        ("bid_px", "<i8"),
        ("ask_px", "<i8"),
        ("bid_sz", "<u4"),
        ("ask_sz", "<u4"),
        ("bid_ct", "<u4"),
        ("ask_ct", "<u4"),
    ]
)
"""One book level of an MBP-10 record, as the record lays it out (32 bytes)."""
_LEVELS_OFFSET = MBP10_DTYPE.fields["bid_px_00"][1]  # type: ignore[index]
_LEVELS_VIEW = np.dtype(
    {
        "names": ["levels"],
        "formats": [(LEVEL_DTYPE, (LEVELS,))],
        "offsets": [_LEVELS_OFFSET],
        "itemsize": MBP10_DTYPE.itemsize,
    }
)
_LEVELS_BYTES = np.dtype(
    {
        "names": ["levels"],
        "formats": [f"V{LEVELS * LEVEL_DTYPE.itemsize}"],
        "offsets": [_LEVELS_OFFSET],
        "itemsize": MBP10_DTYPE.itemsize,
    }
)


def tick_fixed(tick_size: float) -> int:
    """The tick size as a 1e-9 fixed-point integer (``0.25`` -> ``250_000_000``).

    Raises :class:`FeedError` when the tick is not positive or not representable.
    """
    fixed = round(tick_size * PRICE_SCALE)
    if not (tick_size > 0 and fixed > 0):
        raise FeedError(f"tick_size must be positive, got {tick_size!r}")
    return fixed


class Levels(NamedTuple):
    """Strided, read-only views of the 10 levels of ``n`` records, each of shape ``(n, LEVELS)``.

    ``bid_px``/``ask_px`` are int64 fixed-point prices, ``bid_sz``/``ask_sz`` uint32 contracts.
    """

    bid_px: np.ndarray
    ask_px: np.ndarray
    bid_sz: np.ndarray
    ask_sz: np.ndarray


def level_arrays(records: np.ndarray) -> Levels:
    """Views of the book levels of ``records`` (dtype :data:`MBP10_DTYPE`, shape ``(n,)``).

    No copy is made when ``records`` is contiguous; a strided input is copied once.
    """
    if records.dtype != MBP10_DTYPE:
        raise FeedError(f"expected MBP-10 records, got dtype {records.dtype}")
    contiguous = np.ascontiguousarray(records)
    levels = contiguous.view(_LEVELS_VIEW)["levels"]
    return Levels(levels["bid_px"], levels["ask_px"], levels["bid_sz"], levels["ask_sz"])


def levels_at(records: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A copy of the levels of ``records[rows]`` (``records``: dtype :data:`MBP10_DTYPE`, shape
    ``(n,)``) as :data:`LEVEL_DTYPE`, shape ``(len(rows), LEVELS)``. The levels move as raw bytes,
    320 a record (NumPy copies a structured array field by field, several times slower)."""
    if records.dtype != MBP10_DTYPE:
        raise FeedError(f"expected MBP-10 records, got dtype {records.dtype}")
    raw = np.ascontiguousarray(records).view(_LEVELS_BYTES)["levels"][rows]
    levels: np.ndarray = raw.view(LEVEL_DTYPE).reshape(raw.shape[0], LEVELS)
    return levels


@dataclasses.dataclass(frozen=True, slots=True)
class BookSnapshot:
    """The 10-level book of one instrument after one record (a plain copy, safe to keep).

    Prices are 1e-9 fixed-point integers (``UNDEF_PRICE`` for a missing level), sizes contracts;
    each tuple has ``LEVELS`` entries, top of book first. ``ts_recv`` is UNIX ns.
    """

    instrument_id: int
    ts_recv: int
    bid_px: tuple[int, ...]
    ask_px: tuple[int, ...]
    bid_sz: tuple[int, ...]
    ask_sz: tuple[int, ...]

    @classmethod
    def from_record(cls, record: np.ndarray) -> BookSnapshot:
        """The book carried by ``record``: a 0-d or 1-element array of :data:`MBP10_DTYPE`."""
        row = np.asarray(record, dtype=MBP10_DTYPE).reshape(1)
        levels = level_arrays(row)
        return cls(
            instrument_id=int(row["instrument_id"][0]),
            ts_recv=int(row["ts_recv"][0]),
            bid_px=tuple(int(x) for x in levels.bid_px[0]),
            ask_px=tuple(int(x) for x in levels.ask_px[0]),
            bid_sz=tuple(int(x) for x in levels.bid_sz[0]),
            ask_sz=tuple(int(x) for x in levels.ask_sz[0]),
        )

    @property
    def best_bid(self) -> int | None:
        """Best bid price (fixed point), ``None`` when the bid side is empty."""
        return None if self.bid_px[0] == UNDEF_PRICE or self.bid_sz[0] == 0 else self.bid_px[0]

    @property
    def best_ask(self) -> int | None:
        """Best ask price (fixed point), ``None`` when the ask side is empty."""
        return None if self.ask_px[0] == UNDEF_PRICE or self.ask_sz[0] == 0 else self.ask_px[0]
