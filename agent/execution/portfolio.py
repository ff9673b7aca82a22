"""Positions and P&L of the daemon, kept with the shared accounting maths (:mod:`agent.execution.fills`).

One :class:`~agent.execution.fills.PositionArrays` entry per configured instrument, in 1e-9
fixed-point price units; :meth:`Portfolio.apply` books one fill (the caller has written it to the SQL
ledger first). Currency figures use each instrument's tick size and tick value.

Every decision round reads the positions, the entry prices and the unrealised P&L (the
observation rows, the order sizes, the risk check), while fills are rare: the state is also
held as Python numbers, refreshed when a fill or a restore changes it, and the reads run on
them (the same float64 arithmetic as the array functions, without a NumPy call per value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from agent.execution.fills import PositionArrays, apply_fills, to_currency
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
        self._held: list[int] = [0] * n
        self._entry: list[float] = [0.0] * n
        """:attr:`_state`'s positions and average prices as Python numbers (:meth:`_mirror`)."""
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
        self._mirror()
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
        self._mirror()
        self._fees[i] = fees
        self._realised = None

    def _mirror(self) -> None:
        """Refresh the Python copies of the positions and average prices after a change."""
        self._held = [int(q) for q in self._state.position.tolist()]
        self._entry = self._state.avg_price.tolist()

    def position(self, instrument_id: int) -> int:
        return self._held[self._index[instrument_id]]

    def positions(self) -> dict[int, int]:
        return dict(zip(self._index, self._held, strict=True))

    @property
    def flat(self) -> bool:
        """No position in any instrument."""
        return not any(self._held)

    def avg_price(self, instrument_id: int) -> float:
        return self._entry[self._index[instrument_id]]

    def realised(self) -> float:
        """Realised P&L net of fees, account currency."""
        if self._realised is None:
            self._realised = self._currency(self._state.realised_px.tolist()) - float(self._fees.sum())
        return self._realised

    def unrealised(self, marks: Mapping[int, float]) -> float:
        """Open P&L at the given marks (instrument id -> fixed-point price), account currency.
        Instruments without a mark count as zero.

        Each instrument's is ``position * (mark - avg_price)`` on Python floats (0 when flat,
        whatever its mark), summed as :meth:`_currency` sums."""
        return self._currency(
            [
                q * (marks.get(iid, avg) - avg) if q else 0.0
                for iid, q, avg in zip(self._index, self._held, self._entry, strict=True)
            ]
        )

    def _currency(self, pnl_px: Sequence[float]) -> float:
        """The sum over instruments of :func:`to_currency`, in order (on Python floats: the same
        float64 arithmetic without a NumPy scalar per instrument). Zero entries add nothing and
        are skipped: most instruments are flat, and the sums are read every round."""
        total = 0.0
        for pnl, tick, value in zip(pnl_px, self._tick_px, self._tick_value, strict=True):
            if pnl:
                total += float(to_currency(pnl, tick, value))
        return total
