"""What both backtest drivers share besides the trading step (:mod:`agent.trading`): the
decision record and the P&L books.

* :class:`DecisionLog`: every decision row (time, action, target, Kelly size, regime scale, ...);
* :func:`bar_pnl`: per-bar P&L of a fill list marked at the bar-close mids (the accounting maths of
  :mod:`agent.execution.fills`), which both drivers report from.

Units: prices are 1e-9 fixed point (as in DBN) held in float64; P&L and costs are in account
currency; positions in contracts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from agent.trading.decider import Decided
from feeds.config import InstrumentSpec
from feeds.records import PRICE_SCALE

__all__ = ["BarPnl", "DecisionLog", "bar_pnl"]

F64 = npt.NDArray[np.float64]


@dataclass
class DecisionLog:
    """Every decision row a driver took, in the order taken (concatenated on :meth:`arrays`)."""

    parts: dict[str, list[np.ndarray[Any, Any]]] = field(
        default_factory=lambda: {
            k: []
            for k in (
                "ts_ns",
                "instrument",
                "bar",
                "action",
                "valid",
                "target",
                "size",
                "kelly_f",
                "regime",
                "position",
                "ordered",
            )
        }
    )

    def add(
        self,
        *,
        ts_ns: npt.ArrayLike,
        instrument: npt.ArrayLike,
        bar: npt.ArrayLike,
        decided: Decided,
        regime: npt.ArrayLike,
        position: npt.ArrayLike,
        ordered: npt.ArrayLike,
    ) -> None:
        """Append one batch (``instrument``: index into the backtest's instruments; ``bar``: the
        bar's index in its instrument's bar sequence; ``position`` before the decision;
        ``ordered``: the decision sent an order)."""
        for key, value in (
            ("ts_ns", ts_ns),
            ("instrument", instrument),
            ("bar", bar),
            ("action", decided.action),
            ("valid", decided.valid),
            ("target", decided.target),
            ("size", decided.size),
            ("kelly_f", decided.kelly_f),
            ("regime", regime),
            ("position", position),
            ("ordered", ordered),
        ):
            self.parts[key].append(np.atleast_1d(np.asarray(value)))

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """Column arrays sorted by (time, instrument)."""
        cols = {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}
        order = np.lexsort((cols["instrument"], cols["ts_ns"])) if cols["ts_ns"].size else np.zeros(0, int)
        return {k: v[order] for k, v in cols.items()}


class BarPnl(NamedTuple):
    """Per-bar books of one instrument (all ``[T]``, bar order)."""

    pnl: F64
    """Net P&L of the bar in currency: fills' cash flows, fees and the position marked from the
    previous bar's mid to this bar's."""
    cost: F64
    """Fees plus slippage against the decision bar's mid (currency)."""
    traded: F64
    """Contracts traded at the bar."""
    held: F64
    """Absolute position held over the bar (the one its mark-to-market move applies to)."""
    position: F64
    """Position after the bar's fills."""


def bar_pnl(
    spec: InstrumentSpec,
    mark_px: F64,
    *,
    fill_bar: npt.NDArray[np.int64],
    fill_qty: F64,
    fill_px: F64,
    fill_fee: F64,
) -> BarPnl:
    """Books of one instrument from its fills, each attributed to the bar whose decision sent it.

    ``mark_px`` ``[T]``: the bar-close mid (1e-9 fixed point), carried forward over bars whose
    book was not trusted. Equity at bar ``k`` is ``cash(<= k) + position(<= k) * mark_k`` minus
    fees; ``pnl`` is its difference. Its sum equals the ledger's realised plus unrealised P&L at
    the last mark, net of fees.
    """
    n = mark_px.shape[0]
    per_px = spec.tick_value / (spec.tick_size * PRICE_SCALE)
    qty = np.bincount(fill_bar, weights=fill_qty, minlength=n)[:n]
    cash = np.bincount(fill_bar, weights=-fill_qty * fill_px, minlength=n)[:n]
    fee = np.bincount(fill_bar, weights=fill_fee, minlength=n)[:n]
    slip = np.bincount(fill_bar, weights=fill_qty * (fill_px - mark_px[fill_bar]), minlength=n)[:n]
    traded = np.bincount(fill_bar, weights=np.abs(fill_qty), minlength=n)[:n]
    position = np.cumsum(qty)
    equity = (np.cumsum(cash) + position * mark_px) * per_px - np.cumsum(fee)
    pnl = np.diff(equity, prepend=0.0)
    held = np.abs(np.concatenate([[0.0], position[:-1]]))
    return BarPnl(pnl, fee + slip * per_px, traded.astype(np.float64), held, position.astype(np.float64))
