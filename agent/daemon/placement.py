"""The order path: every order the daemon sends leaves through :meth:`Placement.place`, with its
ledger row written first or right behind it, depending on whether the venue outlives this
process.

* An external venue (the gateway) keeps an order after this process dies, and after a restart
  replays its reports, which must find the order in the ledger: the rows are committed first
  (:meth:`agent.daemon.store.SqlWorker.call_orders`, ahead of every other SQL call), the orders
  sent after, in background work beside the decision task so that the next decision does not
  wait for the commit (the orders already count as working). Rows the database refuses halt
  new orders (``database``) and their orders are rejected here: never sent, open nowhere.
* The in-process paper broker dies with the process, and so does every order it holds: the
  orders leave now and their rows join the ordered ledger writes
  (:meth:`agent.daemon.writes.LedgerWrites.queue_orders`), ahead of every report of theirs (the
  broker produces none before :meth:`agent.execution.venues.PaperVenue.submit`). That queue
  never drops an entry and retries while the database is unavailable (new orders halt
  meanwhile); fills still count only once committed. A process killed before the rows' commit
  loses orders that could not have been filled anywhere else, and none of their fills was
  counted: the restart rebuilds exactly what was counted.

An order that leaves is counted with its latency (from the arrival of the record that closed its
bar: :meth:`agent.daemon.metrics.DaemonMetrics.order_sent`) and published on the telemetry
socket (topic ``order``: the order as sent to the venue, plus ``sent_ns``, the wall clock when it left, and
``latency_ns``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import msgspec

from agent.daemon.events import Events
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.store import SqlWorker
from agent.daemon.writes import LedgerWrites
from agent.execution.ledger_rows import ledger_orders
from agent.execution.orders import OrderManager
from agent.execution.protocol import CancelOrder, NewOrder, Reject
from agent.execution.venues import Venue
from storage.errors import DatabaseUnavailable

__all__ = ["Placement"]


class Placement:
    """Sends orders and cancels to ``venue`` (see the module docstring)."""

    def __init__(
        self,
        *,
        venue: Venue,
        writes: LedgerWrites,
        sql: SqlWorker,
        orders: OrderManager,
        metrics: DaemonMetrics,
        events: Events,
        symbols: Mapping[int, str],
        account: str,
        session_id: int,
    ) -> None:
        self.venue = venue
        self._writes = writes
        self._sql = sql
        self._orders = orders
        self._metrics = metrics
        self._events = events
        self._symbols = symbols
        self._account = account
        self._session_id = session_id
        self._sending: set[asyncio.Task[None]] = set()

    def place(self, orders: list[NewOrder], arrivals: list[int]) -> None:
        """Send new orders (their ledger rows first or right behind them); ``arrivals``: when the
        record that closed each one's bar arrived (UNIX ns)."""
        if self.venue.external:
            task = self._events.spawn(self._send(orders, arrivals))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
            return
        self._writes.queue_orders(ledger_orders(orders, account=self._account, session_id=self._session_id))
        self._submit(orders, arrivals)

    def cancel(self, request: CancelOrder) -> None:
        """The trading step's way to cancel an order (limit orders, flatten, shutdown)."""
        self.venue.cancel(request)

    async def sent(self) -> None:
        """Until the orders on their way to the ledger and an external venue have left."""
        await asyncio.gather(*self._sending, return_exceptions=True)

    async def _send(self, orders: list[NewOrder], arrivals: list[int]) -> None:
        """Record the orders in the ledger, then send them (never the other way round)."""
        sql = self._sql
        rows = ledger_orders(orders, account=self._account, session_id=self._session_id)
        try:
            await sql.call_orders(sql.ledger.record_orders, rows)
        except DatabaseUnavailable as exc:
            self._events.halt("database", f"orders not recorded: {exc}")
            for o in orders:  # never sent: they are not open anywhere
                self._orders.apply(
                    Reject(seq=0, client_order_id=o.client_order_id, reason="database", ts_ns=o.ts_ns)
                )
            return
        self._submit(orders, arrivals)

    def _submit(self, orders: list[NewOrder], arrivals: list[int]) -> None:
        for order, arrival in zip(orders, arrivals, strict=True):
            self.venue.submit(order)
            sent = time.time_ns()
            self._metrics.order_sent(self._symbols[order.instrument_id], order.side, (sent - arrival) / 1e9)
            self._events.publish(
                "order", {**msgspec.to_builtins(order), "sent_ns": sent, "latency_ns": sent - arrival}
            )
