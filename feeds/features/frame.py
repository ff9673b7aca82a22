"""The closed bars of one instrument as arrays (:class:`BarFrame`), built from their statistics."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from feeds.config import InstrumentSpec
from feeds.features.definitions import COLUMNS, FEATURE_NAMES, feature_rows
from feeds.features.statistics import BOOK, BarStatistics
from feeds.records import PRICE_SCALE

__all__ = ["BarFrame", "bar_frames"]


@dataclasses.dataclass(slots=True)
class BarFrame:
    """The closed bars of one instrument, ``n`` rows in close order (not frozen: a frozen
    dataclass of 14 fields costs ~2 us more to build, and the incremental path builds one for
    every run of closes).

    ``features`` is float32 ``(n, F)`` with columns :data:`FEATURE_NAMES`; every other array
    is ``(n,)``. Book values are those of the last healthy book at the close (0 when none yet).
    ``close_index`` is the index of the instrument's last record at or before the close: into the
    array given to :func:`~feeds.features.compute_bars` / :func:`~feeds.features.compute_all`, or
    the count of records pushed before it for the incremental path (-1 when none).
    """

    instrument_id: int
    symbol: str
    ts_close: np.ndarray  # int64 UNIX ns
    features: np.ndarray  # float32 (n, F)
    mid_ticks: np.ndarray  # float64, mid / tick_size
    mid_price: np.ndarray  # float64, price units
    spread_ticks: np.ndarray  # float64
    bid_price: np.ndarray  # float64, price units
    ask_price: np.ndarray  # float64, price units
    bid_size: np.ndarray  # int64, contracts at the best bid
    ask_size: np.ndarray  # int64, contracts at the best ask
    close_index: np.ndarray  # int64
    n_records: np.ndarray  # int64, records in the bar
    tradable: np.ndarray  # bool

    def __len__(self) -> int:
        return int(self.ts_close.shape[0])

    @classmethod
    def empty(cls, instrument_id: int, symbol: str) -> BarFrame:
        """A frame with no bar."""
        f8 = np.zeros(0, np.float64)
        i8 = np.zeros(0, np.int64)
        return cls(
            instrument_id,
            symbol,
            i8,
            np.zeros((0, len(FEATURE_NAMES)), np.float32),
            f8,
            f8,
            f8,
            f8,
            f8,
            i8,
            i8,
            i8,
            i8,
            np.zeros(0, bool),
        )

    @classmethod
    def concat(cls, frames: Sequence[BarFrame]) -> BarFrame:
        """The bars of ``frames`` (same instrument, in order) in one frame."""
        if not frames:
            raise ValueError("concat needs at least one frame")
        first = frames[0]
        arrays = {name: np.concatenate([getattr(fr, name) for fr in frames]) for name in _ARRAYS}
        return cls(instrument_id=first.instrument_id, symbol=first.symbol, **arrays)


_ARRAYS = tuple(f.name for f in dataclasses.fields(BarFrame) if f.name not in ("instrument_id", "symbol"))
"""The fields of :class:`BarFrame` that hold one value per bar."""


_SPREAD = COLUMNS["spread_ticks"]
_PRICES = slice(BOOK["bid"], BOOK["ask"] + 1)
assert BOOK["ask"] == BOOK["bid"] + 1


def bar_frames(parts: Sequence[tuple[InstrumentSpec, int]], stats: BarStatistics) -> list[BarFrame]:
    """The :class:`BarFrame` of the closed bars of ``stats``: their features
    (:func:`~feeds.features.definitions.feature_rows`) and the book at each close. ``parts``:
    the instrument of each run of bars and its number of bars, in order (the incremental path
    hands over the bars that one batch of records closed, of every instrument at once); one
    frame per part. ``spread_ticks`` is the feature's float64 row."""
    rows = feature_rows(stats)
    n = rows.shape[1]
    feats = np.empty((n, len(FEATURE_NAMES)), np.float32)
    feats[:] = rows.T
    spread = rows[_SPREAD]
    book = stats.book
    mid = book[:, BOOK["bid"]] + book[:, BOOK["ask"]]
    prices = np.divide(book[:, _PRICES].T, PRICE_SCALE)  # bid, ask
    mid_ticks, mid_price = mid / (2 * stats.tick), mid / (2 * PRICE_SCALE)
    bid_size, ask_size = book[:, BOOK["bid_size"]].copy(), book[:, BOOK["ask_size"]].copy()
    frames = []
    start = 0
    for spec, count in parts:
        part = slice(start, start + count)
        start += count
        frames.append(
            BarFrame(
                instrument_id=spec.instrument_id,
                symbol=spec.symbol,
                ts_close=stats.close_ts[part],
                features=feats[part],
                mid_ticks=mid_ticks[part],
                mid_price=mid_price[part],
                spread_ticks=spread[part],
                bid_price=prices[0, part],
                ask_price=prices[1, part],
                bid_size=bid_size[part],
                ask_size=ask_size[part],
                close_index=stats.close_index[part],
                n_records=stats.n_records[part],
                tradable=stats.tradable[part],
            )
        )
    return frames
