"""Positions and P&L of the daemon, kept with the shared accounting maths (:mod:`agent.execution.fills`).

One :class:`~agent.execution.fills.PositionArrays` entry per configured instrument, in 1e-9
fixed-point price units; :meth:`Portfolio.apply` books one fill (the caller has written it to the SQL
ledger first). Currency figures use each instrument's tick size and tick value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agent.execution.fills import PositionArrays, apply_fills, to_currency, unrealised
from agent.execution.protocol import Fill
from feeds.config import InstrumentSpec
from feeds.records import PRICE_SCALE

__all__ = ["Portfolio"]


class Portfolio:
    """Signed positions, average entry prices, realised P&L and fees per instrument."""

    def __init__(self, instruments: Sequence[InstrumentSpec]) -> None:
        self._index = {spec.instrument_id: i for i, spec in enumerate(instruments)}
        n = len(instruments)
        self._tick_px = [spec.tick_size * PRICE_SCALE for spec in instruments]
        self._tick_value = [spec.tick_value for spec in instruments]
        self._state = PositionArrays.flat(n)
        self._fees = np.zeros(n)
        self._realised: float | None = None
        """:meth:`realised`, computed once per change of the books (it is read every round)."""
        self.fills = 0

    def index(self, instrument_id: int) -> int:
        return self._index[instrument_id]

    def apply(self, fill: Fill) -> None:
        """Book one fill (signed by its side) at its price, and its fee."""
        i = self._index[fill.instrument_id]
        qty = np.zeros(len(self._index))
        price = np.zeros(len(self._index))
        qty[i] = fill.qty if fill.side == "buy" else -fill.qty
        price[i] = fill.price
        self._state = apply_fills(self._state, qty, price)
        self._fees[i] += fill.fee
        self._realised = None
        self.fills += 1

    def restore(
        self, instrument_id: int, position: int, avg_price: float, realised_px: float, fees: float
    ) -> None:
        """Set one instrument's state rebuilt from the ledger (fixed-point price units)."""
        i = self._index[instrument_id]
        pos, avg, real = (np.array(a, copy=True) for a in self._state)
        pos[i], avg[i], real[i] = position, avg_price, realised_px
        self._state = PositionArrays(pos, avg, real)
        self._fees[i] = fees
        self._realised = None

    def position(self, instrument_id: int) -> int:
        return int(self._state.position[self._index[instrument_id]])

    def positions(self) -> dict[int, int]:
        return {iid: int(self._state.position[i]) for iid, i in self._index.items()}

    def avg_price(self, instrument_id: int) -> float:
        return float(self._state.avg_price[self._index[instrument_id]])

    def realised(self) -> float:
        """Realised P&L net of fees, account currency."""
        if self._realised is None:
            self._realised = self._currency(self._state.realised_px) - float(self._fees.sum())
        return self._realised

    def unrealised(self, marks: Mapping[int, float]) -> float:
        """Open P&L at the given marks (instrument id -> fixed-point price), account currency.
        Instruments without a mark count as zero."""
        mark = self._state.avg_price.copy()
        for iid, price in marks.items():
            i = self._index.get(iid)
            if i is not None:
                mark[i] = price
        return self._currency(unrealised(self._state, mark))

    def _currency(self, pnl_px: np.ndarray[Any, np.dtype[np.float64]]) -> float:
        """The sum over instruments of :func:`to_currency` (on Python floats: the same float64
        arithmetic without a NumPy scalar per instrument)."""
        return sum(
            float(to_currency(pnl, tick, value))
            for pnl, tick, value in zip(pnl_px.tolist(), self._tick_px, self._tick_value, strict=True)
        )

    def unrealised_of(self, instrument_id: int, mark: float) -> float:
        """Open P&L of one instrument at ``mark`` (fixed-point price), account currency."""
        i = self._index[instrument_id]
        one = PositionArrays(*(a[i : i + 1] for a in self._state))
        pnl = unrealised(one, np.array([mark], dtype=np.float64))
        return float(to_currency(pnl, self._tick_px[i], self._tick_value[i])[0])
