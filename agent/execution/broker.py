"""The paper broker: a simulated exchange that fills orders against the live MBP-10 book.

DESIGN section 8. The broker runs on the feed clock (``ts_recv`` of the records it is given):

* An order placed at ``t`` *arrives* at ``t + latency``. It is executed against the book as it
  stood at that moment, i.e. the last record with ``ts_recv <= t + latency``; the broker learns
  that moment when the first later record arrives (or when :meth:`PaperBroker.advance` is
  called with a later clock, which the daemon does when a feed goes quiet).
* **Market orders** walk the levels for their size (:func:`agent.execution.fills.walk_book`,
  the one implementation of fill maths shared with the backtest and the trainer); whatever
  the displayed depth cannot fill is cancelled (immediate-or-cancel) and reported as
  :class:`~agent.execution.protocol.Cancelled`.
* **Limit orders** first take whatever is marketable at or better than the limit (the same
  book walk over the levels within the limit), then rest. A resting order's queue position is
  estimated as the size displayed at its price when it arrived; trades at that price reduce the
  queue ahead (what trades beyond it fills the order), the queue ahead never exceeds the size
  still displayed at the price (cancellations ahead of us are assumed to be ahead), and the whole
  rest fills at the limit when the opposite best price reaches it or a trade prints through it.
* Fees are :func:`agent.execution.fills.fees` per contract. One execution produces one
  :class:`~agent.execution.protocol.Fill` at the volume-weighted average price of the levels it
  took, rounded to the nearest 1e-9 fixed-point unit (the ledger stores integer prices; the
  rounding is at most half a nano-unit per contract and the ledger P&L is computed from the
  stored price). With ``fill_price = "mid"`` (a control experiment without spread cost) a
  market order fills the same quantity at the mid of the book it meets instead
  (:func:`agent.execution.fills.execution_price`).

Reports (Ack, Reject, Fill, Cancelled) carry a per-broker ``seq``; fill ids are
``<client_order_id>.<n>``, unique because client order ids are unique forever.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.execution.config import BrokerConfig
from agent.execution.fills import execution_price, fees, walk_book
from agent.execution.protocol import Ack, Cancelled, CancelOrder, Fill, NewOrder, Reject, Report, Side
from feeds.book import level_arrays
from feeds.records import ACTION_TRADE, MBP10_DTYPE, UNDEF_PRICE

__all__ = ["BookLevels", "PaperBroker", "book_levels"]

_MAX_UNRESOLVED = 256
"""Batches kept by reference before the last record per instrument is worked out."""


@dataclass(frozen=True, slots=True)
class BookLevels:
    """The 10 levels of one MBP-10 record: prices (int64, 1e-9 fixed point) and sizes, ``[10]``."""

    bid_px: np.ndarray[Any, np.dtype[np.int64]]
    bid_sz: np.ndarray[Any, np.dtype[np.int64]]
    ask_px: np.ndarray[Any, np.dtype[np.int64]]
    ask_sz: np.ndarray[Any, np.dtype[np.int64]]

    def size_at(self, side: Side, price: int) -> int:
        """Displayed size at ``price`` on the side a ``side`` limit order rests on (0 if absent)."""
        px, sz = (self.bid_px, self.bid_sz) if side == "buy" else (self.ask_px, self.ask_sz)
        hit = np.flatnonzero(px == price)
        return int(sz[hit[0]]) if hit.size else 0

    def best_opposite(self, side: Side) -> int | None:
        """Best price an order of ``side`` would take (best ask for a buy), None when empty."""
        px, sz = (self.ask_px, self.ask_sz) if side == "buy" else (self.bid_px, self.bid_sz)
        if sz[0] <= 0 or px[0] == UNDEF_PRICE:
            return None
        return int(px[0])


def book_levels(record: np.void) -> BookLevels:
    """Extract the levels of one record of :data:`feeds.records.MBP10_DTYPE` (through the record
    layout's level view, :func:`feeds.book.level_arrays`: a field-by-field read costs 40 NumPy
    scalars)."""
    levels = level_arrays(np.frombuffer(record, dtype=MBP10_DTYPE))
    return BookLevels(
        bid_px=levels.bid_px[0].astype(np.int64),
        bid_sz=levels.bid_sz[0].astype(np.int64),
        ask_px=levels.ask_px[0].astype(np.int64),
        ask_sz=levels.ask_sz[0].astype(np.int64),
    )


@dataclass(slots=True)
class _Working:
    order: NewOrder
    arrive_ns: int
    leaves: int
    fills: int = 0
    queue_ahead: int = 0
    resting: bool = False


@dataclass(slots=True)
class _Instrument:
    last: np.void | None = None
    pending: list[_Working] = field(default_factory=list)
    resting: list[_Working] = field(default_factory=list)
    cancels: list[tuple[int, str]] = field(default_factory=list)


class PaperBroker:
    """Simulated exchange for the configured instruments; every method returns the reports it
    produced, in order. Not thread-safe: call it from one task."""

    def __init__(self, config: BrokerConfig, instrument_ids: Iterable[int], seq_start: int = 0) -> None:
        self._latency_ns = int(config.latency_ms * 1_000_000)
        self._fee = config.fee_per_contract
        self._fill_price = config.fill_price
        self._books = {int(i): _Instrument() for i in instrument_ids}
        self._orders: dict[str, _Working] = {}
        self._seen: set[str] = set()
        self._seq = seq_start
        self._clock_ns = 0
        self._unresolved: list[np.ndarray[Any, np.dtype[np.void]]] = []

    @property
    def seq(self) -> int:
        """The ``seq`` of the last report produced."""
        return self._seq

    def open_orders(self) -> list[NewOrder]:
        """Orders that are pending arrival or resting."""
        return [w.order for w in self._orders.values()]

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    # -- order entry ---------------------------------------------------------------------------

    def submit(self, order: NewOrder) -> list[Report]:
        """Accept an order for execution at ``order.ts_ns + latency``; invalid ones are rejected now."""
        reason = ""
        if order.client_order_id in self._seen:
            reason = "duplicate client_order_id"
        elif order.instrument_id not in self._books:
            reason = f"unknown instrument {order.instrument_id}"
        elif order.qty <= 0:
            reason = "qty must be > 0"
        elif order.order_type == "limit" and order.limit_price is None:
            reason = "limit order without limit_price"
        if reason:
            return [
                Reject(
                    seq=self._next(), client_order_id=order.client_order_id, reason=reason, ts_ns=order.ts_ns
                )
            ]
        self._seen.add(order.client_order_id)
        working = _Working(order=order, arrive_ns=order.ts_ns + self._latency_ns, leaves=order.qty)
        self._orders[order.client_order_id] = working
        self._books[order.instrument_id].pending.append(working)
        return []

    def cancel(self, request: CancelOrder) -> list[Report]:
        """Cancel what is left of an order once the request arrives (after the latency)."""
        working = self._orders.get(request.client_order_id)
        if working is None:
            reason = "unknown or already closed order"
            return [
                Reject(
                    seq=self._next(),
                    client_order_id=request.client_order_id,
                    reason=reason,
                    ts_ns=request.ts_ns,
                )
            ]
        book = self._books[working.order.instrument_id]
        book.cancels.append((request.ts_ns + self._latency_ns, request.client_order_id))
        return []

    # -- market data -----------------------------------------------------------------------------

    def on_records(self, records: np.ndarray[Any, np.dtype[np.void]]) -> list[Report]:
        """Advance the book with a batch of MBP-10 records (time order) and execute what is due.

        Instruments without working orders cost nothing per record: their batches are kept by
        reference and their last record is looked up only when an order needs their book.
        """
        if records.dtype != MBP10_DTYPE or records.size == 0:
            return []
        self._clock_ns = max(self._clock_ns, int(records["ts_recv"][-1]))
        active = [i for i, b in self._books.items() if b.pending or b.resting or b.cancels]
        if not active:
            self._unresolved.append(records)
            if len(self._unresolved) >= _MAX_UNRESOLVED:
                self._resolve()
            return []
        self._resolve()
        reports: list[Report] = []
        ids = records["instrument_id"]
        wanted = ids == active[0]  # a comparison per active instrument: cheaper than np.isin
        for inst in active[1:]:
            wanted |= ids == inst
        hits = np.flatnonzero(wanted)
        for k, inst, ts_ns in zip(
            hits.tolist(), ids[hits].tolist(), records["ts_recv"][hits].tolist(), strict=True
        ):
            book = self._books[inst]
            self._due(book, ts_ns, reports)
            book.last = records[k]
            if book.resting:
                self._on_resting(book, records[k], reports)
        self._unresolved.append(records)
        self._resolve()
        return reports

    def _resolve(self) -> None:
        """Set each instrument's book to its last record in the batches seen since last time."""
        if not self._unresolved:
            return
        batches, self._unresolved = self._unresolved, []
        missing = set(self._books)
        for records in reversed(batches):  # newest first; no copy (concatenating 256 costs ms)
            # a walk back from the end stops at the first record of the last instrument missing:
            # at most a few records into a batch where all trade (np.unique costs ~10 us a call);
            # where one is absent, the whole batch, once, at about np.unique's cost a record
            ids = records["instrument_id"].tolist()
            for j in range(len(ids) - 1, -1, -1):
                inst = ids[j]
                if inst in missing:
                    missing.discard(inst)
                    self._books[inst].last = records[j]
                    if not missing:
                        return

    def advance(self, now_ns: int) -> list[Report]:
        """Execute every order and cancel due by ``now_ns`` against the current book (quiet feed)."""
        self._clock_ns = max(self._clock_ns, now_ns)
        waiting = [book for book in self._books.values() if book.pending or book.cancels]
        if not waiting:  # the books are worked out when an order needs them
            return []
        self._resolve()
        reports: list[Report] = []
        for book in waiting:
            self._due(book, now_ns + 1, reports)
        return reports

    def _due(self, book: _Instrument, ts_ns: int, reports: list[Report]) -> None:
        """Everything that arrived strictly before ``ts_ns`` executes against ``book.last``."""
        if book.pending:
            due = [w for w in book.pending if w.arrive_ns < ts_ns]
            if due:
                book.pending = [w for w in book.pending if w.arrive_ns >= ts_ns]
                for working in due:
                    self._arrive(book, working, reports)
        if book.cancels:
            ready = [c for c in book.cancels if c[0] < ts_ns]
            if ready:
                book.cancels = [c for c in book.cancels if c[0] >= ts_ns]
                for arrive_ns, coid in ready:
                    self._apply_cancel(book, coid, arrive_ns, reports)

    def _arrive(self, book: _Instrument, working: _Working, reports: list[Report]) -> None:
        order = working.order
        reports.append(Ack(seq=self._next(), client_order_id=order.client_order_id, ts_ns=working.arrive_ns))
        if book.last is None:
            self._close(working, working.arrive_ns, "no book yet", reports)
            return
        levels = book_levels(book.last)
        if order.order_type == "limit":
            assert order.limit_price is not None
            levels = _within_limit(levels, order.side, order.limit_price)
        self._take(levels, working, working.arrive_ns, reports)
        if working.leaves == 0:
            return
        if order.order_type == "market":
            self._close(working, working.arrive_ns, "no depth", reports)
            return
        assert order.limit_price is not None
        working.resting = True
        working.queue_ahead = book_levels(book.last).size_at(order.side, order.limit_price)
        book.resting.append(working)

    def _take(self, levels: BookLevels, working: _Working, ts_ns: int, reports: list[Report]) -> None:
        sign = 1 if working.order.side == "buy" else -1
        result = walk_book(
            levels.bid_px[None, :],
            levels.bid_sz[None, :],
            levels.ask_px[None, :],
            levels.ask_sz[None, :],
            np.array([sign * working.leaves], dtype=np.float64),
        )
        price = execution_price(result, levels.bid_px[:1], levels.ask_px[:1], self._fill_price)
        qty = abs(round(float(result.filled[0])))
        if qty > 0 and np.isfinite(price[0]):
            self._fill(working, qty, round(float(price[0])), ts_ns, reports)

    def _fill(self, working: _Working, qty: int, price: int, ts_ns: int, reports: list[Report]) -> None:
        order = working.order
        working.leaves -= qty
        working.fills += 1
        fee = float(fees(np.array([float(qty)]), self._fee)[0])
        reports.append(
            Fill(
                seq=self._next(),
                fill_id=f"{order.client_order_id}.{working.fills}",
                client_order_id=order.client_order_id,
                instrument_id=order.instrument_id,
                side=order.side,
                qty=qty,
                price=price,
                fee=fee,
                leaves_qty=working.leaves,
                ts_ns=ts_ns,
            )
        )
        if working.leaves == 0:
            self._orders.pop(order.client_order_id, None)

    def _close(self, working: _Working, ts_ns: int, reason: str, reports: list[Report]) -> None:
        coid = working.order.client_order_id
        reports.append(
            Cancelled(
                seq=self._next(),
                client_order_id=coid,
                cancelled_qty=working.leaves,
                reason=reason,
                ts_ns=ts_ns,
            )
        )
        working.leaves = 0
        self._orders.pop(coid, None)

    def _apply_cancel(self, book: _Instrument, coid: str, ts_ns: int, reports: list[Report]) -> None:
        working = self._orders.get(coid)
        if working is None:  # filled (or closed) before the cancel arrived
            reports.append(
                Reject(seq=self._next(), client_order_id=coid, reason="too late: order closed", ts_ns=ts_ns)
            )
            return
        if working in book.pending:  # cancelled before it even arrived
            book.pending.remove(working)
        if working in book.resting:
            book.resting.remove(working)
        self._close(working, ts_ns, "cancelled", reports)

    def _on_resting(self, book: _Instrument, record: np.void, reports: list[Report]) -> None:
        ts_ns = int(record["ts_recv"])
        levels = book_levels(record)
        traded = int(record["size"]) if record["action"] == ACTION_TRADE else 0
        trade_px = int(record["price"])
        still: list[_Working] = []
        for working in book.resting:
            order = working.order
            assert order.limit_price is not None
            limit = order.limit_price
            best = levels.best_opposite(order.side)
            through = best is not None and (best <= limit if order.side == "buy" else best >= limit)
            if traded and trade_px != UNDEF_PRICE:
                beyond = trade_px < limit if order.side == "buy" else trade_px > limit
                through = through or beyond
            if through:
                self._fill(working, working.leaves, limit, ts_ns, reports)
                continue
            if traded and trade_px == limit:
                working.queue_ahead -= traded
                if working.queue_ahead < 0:
                    qty = min(-working.queue_ahead, working.leaves)
                    working.queue_ahead = 0
                    self._fill(working, qty, limit, ts_ns, reports)
            working.queue_ahead = min(working.queue_ahead, levels.size_at(order.side, limit))
            if working.leaves > 0:
                still.append(working)
        book.resting = still


def _within_limit(levels: BookLevels, side: Side, limit: int) -> BookLevels:
    """The book with the opposite levels beyond ``limit`` emptied (size 0)."""
    if side == "buy":
        ask_sz = np.where(levels.ask_px <= limit, levels.ask_sz, 0)
        return BookLevels(levels.bid_px, levels.bid_sz, levels.ask_px, ask_sz)
    bid_sz = np.where((levels.bid_px >= limit) & (levels.bid_px != UNDEF_PRICE), levels.bid_sz, 0)
    return BookLevels(levels.bid_px, bid_sz, levels.ask_px, levels.ask_sz)
