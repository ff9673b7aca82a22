"""Order state of the daemon: ids, open orders, working quantity, and what each report does.

The manager never invents a fill: an order's filled quantity changes only through a
:class:`~agent.execution.protocol.Fill` that the caller has already written to the ledger
(DESIGN section 8: the ledger first, then the position). Reports are idempotent: a fill id seen
before, or a report for an order already closed, changes nothing and is counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.execution.protocol import Ack, Cancelled, Fill, NewOrder, OrderType, Reject, Report, Side

__all__ = ["OpenOrder", "OrderManager"]


@dataclass(slots=True)
class OpenOrder:
    """An order that may still fill."""

    order: NewOrder
    filled: int = 0
    acked: bool = False
    sent_wall_ns: int = 0
    """Wall-clock time it was sent (ack timeout), 0 for orders restored from the ledger."""
    cancel_sent: bool = False

    @property
    def leaves(self) -> int:
        return self.order.qty - self.filled

    @property
    def signed_leaves(self) -> int:
        return self.leaves if self.order.side == "buy" else -self.leaves


class OrderManager:
    """Open orders of one daemon session. Client order ids are ``<prefix>-<n>``; the prefix must
    be unique per session (the daemon uses its ledger session id) so ids are unique forever."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._n = 0
        self._open: dict[str, OpenOrder] = {}
        self.last_seq = 0
        """Highest report ``seq`` applied (sent in ``Hello`` so the gateway replays the rest)."""
        self.ignored_reports = 0
        """Reports for unknown or closed orders, or replayed ones (counted, never applied twice)."""

    def new(
        self,
        instrument_id: int,
        side: Side,
        qty: int,
        ts_ns: int,
        *,
        order_type: OrderType = "market",
        limit_price: int | None = None,
        wall_ns: int = 0,
    ) -> NewOrder:
        """Create and track a new order (it is open from now on, until a report closes it)."""
        self._n += 1
        order = NewOrder(
            client_order_id=f"{self.prefix}-{self._n}",
            instrument_id=instrument_id,
            side=side,
            qty=qty,
            order_type=order_type,
            limit_price=limit_price,
            ts_ns=ts_ns,
        )
        self._open[order.client_order_id] = OpenOrder(order=order, sent_wall_ns=wall_ns)
        return order

    def restore(self, orders: Iterable[OpenOrder], last_seq: int = 0) -> None:
        """Adopt open orders rebuilt from the ledger after a restart."""
        for entry in orders:
            self._open[entry.order.client_order_id] = entry
        self.last_seq = max(self.last_seq, last_seq)

    def get(self, client_order_id: str) -> OpenOrder | None:
        return self._open.get(client_order_id)

    def open_orders(self, instrument_id: int | None = None) -> list[OpenOrder]:
        return [
            o for o in self._open.values() if instrument_id is None or o.order.instrument_id == instrument_id
        ]

    def working(self, instrument_id: int) -> int:
        """Signed quantity still open on ``instrument_id`` (buys positive)."""
        return sum(o.signed_leaves for o in self._open.values() if o.order.instrument_id == instrument_id)

    def unacked_since(self, wall_ns: int) -> list[OpenOrder]:
        """Orders sent before ``wall_ns`` that have no acknowledgement yet."""
        return [o for o in self._open.values() if not o.acked and 0 < o.sent_wall_ns < wall_ns]

    def apply(self, report: Report) -> bool:
        """Apply one report; True if it changed the state. Fills must be in the ledger already."""
        self.last_seq = max(self.last_seq, report.seq)
        entry = self._open.get(report.client_order_id)
        if entry is None:
            self.ignored_reports += 1
            return False
        if isinstance(report, Ack):
            entry.acked = True
        elif isinstance(report, Fill):
            entry.acked = True
            entry.filled = min(entry.order.qty, entry.filled + report.qty)
            if report.leaves_qty == 0 or entry.leaves == 0:
                del self._open[report.client_order_id]
        elif isinstance(report, Cancelled | Reject):
            if isinstance(report, Reject) and entry.cancel_sent and entry.acked:
                entry.cancel_sent = False  # a refused cancel: the order is still working
                return True
            del self._open[report.client_order_id]
        return True
