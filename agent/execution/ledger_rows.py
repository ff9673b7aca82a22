"""Wire messages as ledger rows: the one translation from :mod:`agent.execution.protocol`
(what venues speak: ``NewOrder``, ``Fill``) to :mod:`storage.values` (what the ledger stores:
``LedgerOrder``, ``LedgerFill``), shared by the daemon and the event-driven backtest so both
persist exactly the same rows."""

from __future__ import annotations

from collections.abc import Iterable

from agent.execution.protocol import Fill, NewOrder
from storage.values import LedgerFill, LedgerOrder

__all__ = ["ledger_fills", "ledger_orders"]


def ledger_orders(orders: Iterable[NewOrder], *, account: str, session_id: int | None) -> list[LedgerOrder]:
    """The ledger rows of ``orders`` placed by ``account`` in daemon session ``session_id``."""
    return [
        LedgerOrder(
            client_order_id=o.client_order_id,
            instrument_id=o.instrument_id,
            side=o.side,
            qty=o.qty,
            ts_ns=o.ts_ns,
            order_type=o.order_type,
            limit_price=o.limit_price,
            account=account,
            session_id=session_id,
        )
        for o in orders
    ]


def ledger_fills(fills: Iterable[Fill]) -> list[LedgerFill]:
    """The ledger rows of venue fill reports (prices in 1e-9 fixed point, as on the wire)."""
    return [
        LedgerFill(
            fill_id=f.fill_id,
            client_order_id=f.client_order_id,
            qty=f.qty,
            price=f.price,
            ts_ns=f.ts_ns,
            fee=f.fee,
        )
        for f in fills
    ]
