"""The trading ledger: orders, fills (idempotent), positions, and recovery after a restart.

Contract with the trading side:

* ``record_order`` before the order leaves the process; ``client_order_id`` is the
  idempotency key (recording the same order twice stores it once).
* ``record_fills`` before a position counts a fill. A fill is *acknowledged* when the call
  returns: it is then committed (durable under the configured SQLite ``synchronous`` level or
  PostgreSQL's WAL). The same ``fill_id`` recorded twice is stored once, so after a
  ``FillsNotPersisted`` the caller simply re-submits the same fills later; in the meantime it
  must stop placing new orders. Positions and the orders' filled quantities are updated in
  the same transaction, from the newly inserted fills only (no double counting).
* ``rebuild`` after a restart recomputes positions and open orders from the fills themselves
  and repairs the ``positions`` table if it disagrees.

Every method runs its own transaction and is safe from any thread; calls block, so asyncio
code uses a worker thread (a single dedicated writer thread keeps fills in order). Writes are
retried on transient failures until ``StorageConfig.retry_deadline_s``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from storage._sql import insert_ignoring_conflicts
from storage.database import Database
from storage.errors import FillsNotPersisted, InvalidRecord, NotFound, StorageError
from storage.ledger_rows import (
    check_fill,
    check_order,
    fill_record,
    order_record,
    position_state,
    same_fill,
    same_order,
    store_position,
)
from storage.tables import FillRow, OrderRow, PositionRow
from storage.values import (
    OPEN_ORDER_STATUSES,
    FillRecord,
    FillsResult,
    LedgerFill,
    LedgerOrder,
    LedgerState,
    OrderRecord,
    OrderStatus,
    PositionState,
    Side,
)

__all__ = ["Ledger", "LedgerWrite", "OrderUpdate", "apply_fill"]

log = logging.getLogger(__name__)

PRICE_UNIT = 1e-9
"""The price of one DBN fixed-point step: ``price * PRICE_UNIT`` turns a fixed-point integer into
price units (the inverse of ``feeds.records.PRICE_SCALE``; ``storage`` does not import ``feeds``)."""
_TERMINAL: frozenset[str] = frozenset({"filled", "cancelled", "rejected"})


def apply_fill(
    position: PositionState, *, side: Side, qty: int, price: int, fee: float, ledger_id: int
) -> PositionState:
    """The position after one fill (average-cost accounting; the one implementation).

    ``price`` is 1e-9 fixed point. Adding to a position moves the average price; reducing it
    realises ``closed x (price - avg)`` in the position's direction; crossing zero opens the
    remainder at ``price``.
    """
    signed = qty if side == "buy" else -qty
    px = price * PRICE_UNIT
    held = position.qty
    avg = position.avg_price
    realized = position.realized_points
    new_qty = held + signed
    if held == 0 or (held > 0) == (signed > 0):
        avg = (avg * abs(held) + px * qty) / abs(new_qty)
    else:
        closed = min(qty, abs(held))
        realized += closed * (px - avg) * (1 if held > 0 else -1)
        if new_qty == 0:
            avg = 0.0
        elif (new_qty > 0) != (held > 0):
            avg = px
    return PositionState(
        account=position.account,
        instrument_id=position.instrument_id,
        qty=new_qty,
        avg_price=avg,
        realized_points=realized,
        fees=position.fees + fee,
        last_fill_id=ledger_id,
    )


@dataclass(frozen=True, slots=True)
class OrderUpdate:
    """An acknowledgement, cancel or reject of an order (:meth:`Ledger.update_order`)."""

    client_order_id: str
    status: OrderStatus
    ts_ns: int
    reason: str | None = None

    def check(self) -> None:
        if self.status not in ("acked", "cancelled", "rejected"):
            raise InvalidRecord(
                f"order {self.client_order_id}: status {self.status!r} is set by fills, not by update_order"
            )


LedgerWrite = LedgerOrder | LedgerFill | OrderUpdate
"""One write of :meth:`Ledger.record`."""


_Row = TypeVar("_Row", OrderRow, FillRow)


def _stored(session: Session, row_type: type[_Row], key: str, values: list[str]) -> dict[str, _Row]:
    """The stored rows of ``row_type`` whose unique column ``key`` is one of ``values``, by it
    (what a write that met a conflict compares itself with)."""
    column = getattr(row_type, key)
    return {getattr(r, key): r for r in session.scalars(select(row_type).where(column.in_(values)))}


def _unique_fills(fills: Sequence[LedgerFill]) -> list[LedgerFill]:
    """``fills`` checked, each fill id once (the same fill twice is one; twice with different
    content is refused)."""
    for fill in fills:
        check_fill(fill)
    unique: dict[str, LedgerFill] = {}
    for fill in fills:
        first = unique.setdefault(fill.fill_id, fill)
        if first != fill:
            raise InvalidRecord(f"fill {fill.fill_id} appears twice in the batch with different content")
    return list(unique.values())


@dataclass(slots=True)
class _OrderState:
    """The columns of an order that recording fills reads and changes (lighter than the ORM)."""

    id: int
    client_order_id: str
    account: str
    instrument_id: int
    side: str
    qty: int
    filled_qty: int
    status: str
    ts_updated_ns: int


_ORDER_STATE_COLUMNS = (
    OrderRow.id,
    OrderRow.client_order_id,
    OrderRow.account,
    OrderRow.instrument_id,
    OrderRow.side,
    OrderRow.qty,
    OrderRow.filled_qty,
    OrderRow.status,
    OrderRow.ts_updated_ns,
)


class Ledger:
    """Orders, fills and positions of every account in one database."""

    def __init__(self, database: Database) -> None:
        self._db = database

    # orders ---------------------------------------------------------------------------------

    def record_orders(self, orders: Sequence[LedgerOrder]) -> tuple[str, ...]:
        """Record orders idempotently (one transaction); return the ids newly stored.

        An order whose ``client_order_id`` exists with different content is refused
        (``InvalidRecord``; nothing stored). Unknown instrument or session: ``InvalidRecord``.
        """
        for order in orders:
            check_order(order)
        return self._db.write(lambda s: self._record_orders(s, orders), what="record orders")

    @staticmethod
    def _record_orders(session: Session, orders: Sequence[LedgerOrder]) -> tuple[str, ...]:
        rows = [
            {
                "client_order_id": o.client_order_id,
                "session_id": o.session_id,
                "account": o.account,
                "instrument_id": o.instrument_id,
                "side": o.side,
                "qty": o.qty,
                "order_type": o.order_type,
                "limit_price": o.limit_price,
                "status": "new",
                "filled_qty": 0,
                "ts_created_ns": o.ts_ns,
                "ts_updated_ns": o.ts_ns,
            }
            for o in orders
        ]
        key = ["client_order_id"]
        new = {r[0] for r in insert_ignoring_conflicts(session, OrderRow, rows, key, key)}
        seen = [o for o in orders if o.client_order_id not in new]
        if seen:
            stored = _stored(session, OrderRow, "client_order_id", [o.client_order_id for o in seen])
            for order in seen:
                row = stored.get(order.client_order_id)
                if row is None or not same_order(row, order):
                    raise InvalidRecord(
                        f"client_order_id {order.client_order_id} is already used by a different order"
                    )
        return tuple(o.client_order_id for o in orders if o.client_order_id in new)

    def record_order(self, order: LedgerOrder) -> OrderRecord:
        """Record one order idempotently and return it as stored."""
        self.record_orders([order])
        return self.order(order.client_order_id)

    def order(self, client_order_id: str) -> OrderRecord:
        """One order by its client order id (``NotFound`` if unknown)."""

        def work(session: Session) -> OrderRecord:
            row = session.scalar(select(OrderRow).where(OrderRow.client_order_id == client_order_id))
            if row is None:
                raise NotFound(f"no order {client_order_id}")
            return order_record(row)

        return self._db.read(work, what="read order")

    def update_order(
        self, client_order_id: str, status: OrderStatus, *, ts_ns: int, reason: str | None = None
    ) -> OrderRecord:
        """Record an acknowledgement, cancel or reject of an order; return it as stored.

        ``filled``/``partially_filled`` are set by ``record_fills`` only. An order already in a
        terminal state (filled, cancelled, rejected) keeps it: a cancel acknowledgement that
        crosses a fill is normal and is not an error.
        """
        change = OrderUpdate(client_order_id, status, ts_ns, reason)
        change.check()
        return self._db.write(lambda s: self._update_order(s, change), what="update order")

    @staticmethod
    def _update_order(session: Session, change: OrderUpdate) -> OrderRecord:
        row = session.scalar(
            select(OrderRow).where(OrderRow.client_order_id == change.client_order_id).with_for_update()
        )
        if row is None:
            raise InvalidRecord(f"no order {change.client_order_id} to update")
        status = change.status
        if row.status not in _TERMINAL and not (status == "acked" and row.status == "partially_filled"):
            row.status = status
            row.reason = change.reason
            row.ts_updated_ns = max(row.ts_updated_ns, change.ts_ns)
        return order_record(row)

    def open_orders(self, account: str = "default") -> list[OrderRecord]:
        """Orders of ``account`` still working (new, acked, partially filled), oldest first."""

        def work(session: Session) -> list[OrderRecord]:
            rows = session.scalars(
                select(OrderRow)
                .where(OrderRow.account == account, OrderRow.status.in_(OPEN_ORDER_STATUSES))
                .order_by(OrderRow.id)
            )
            return [order_record(r) for r in rows]

        return self._db.read(work, what="read open orders")

    # fills ----------------------------------------------------------------------------------

    def record_fills(self, fills: Sequence[LedgerFill]) -> FillsResult:
        """Store fills once each and update orders and positions, in one transaction.

        Returns which fill ids were new and which were already stored. Raises
        ``FillsNotPersisted`` when the database stayed unavailable past the retry deadline
        (nothing of this call is acknowledged; re-submit later), ``DiskFull`` at once when the
        database cannot grow (likewise: re-submit once space is freed) and ``InvalidRecord`` for bad
        input (unknown order, over-fill, NaN fee, a fill id reused with other content; nothing
        stored).
        """
        batch = _unique_fills(fills)
        ids = tuple(f.fill_id for f in batch)
        if not batch:
            return FillsResult(inserted=(), duplicates=())

        def give_up(message: str, attempts: int) -> StorageError:
            return FillsNotPersisted(
                f"{len(ids)} fill(s) not persisted: {message}", fill_ids=ids, attempts=attempts
            )

        return self._db.write(lambda s: self._record_fills(s, batch), what="record fills", give_up=give_up)

    def record(self, writes: Sequence[LedgerWrite]) -> None:
        """Several writes in one transaction, each as its own method would make it: orders as
        :meth:`record_orders`, fills as :meth:`record_fills`, status changes as
        :meth:`update_order`. The orders are inserted first, all together (a fill or change
        always follows its order's row); the fills and changes then apply in their order, each
        run of consecutive fills at once. All or nothing, with the same errors as those methods
        (for a writer that needs no per-write result, such as the event-driven backtest)."""
        orders = [w for w in writes if isinstance(w, LedgerOrder)]
        for order in orders:
            check_order(order)
        steps: list[list[LedgerFill] | OrderUpdate] = []
        for w in writes:
            if isinstance(w, OrderUpdate):
                w.check()
                steps.append(w)
            elif isinstance(w, LedgerFill):
                if steps and isinstance(steps[-1], list):
                    steps[-1].append(w)
                else:
                    steps.append([w])
        runs = [step if isinstance(step, OrderUpdate) else _unique_fills(step) for step in steps]

        def work(session: Session) -> None:
            if orders:
                self._record_orders(session, orders)
            for step in runs:
                if isinstance(step, OrderUpdate):
                    self._update_order(session, step)
                else:
                    self._record_fills(session, step)
                # Each step reads the rows as the last one left them: its ORM changes flushed,
                # the objects it loaded expired (the fills' bulk updates bypass them).
                session.flush()
                session.expire_all()

        if writes:
            self._db.write(work, what=f"record {len(writes)} ledger writes")

    def _record_fills(self, session: Session, batch: list[LedgerFill]) -> FillsResult:
        order_ids = sorted({f.client_order_id for f in batch})
        orders = {
            row.client_order_id: _OrderState(*row)
            for row in session.execute(
                select(*_ORDER_STATE_COLUMNS)
                .where(OrderRow.client_order_id.in_(order_ids))
                .order_by(OrderRow.id)
                .with_for_update()
            )
        }
        missing = [i for i in order_ids if i not in orders]
        if missing:
            raise InvalidRecord(f"fills refer to unknown orders: {', '.join(missing[:5])}")
        rows = []
        for f in batch:
            order = orders[f.client_order_id]
            rows.append(
                {
                    "fill_id": f.fill_id,
                    "client_order_id": f.client_order_id,
                    "account": order.account,
                    "instrument_id": order.instrument_id,
                    "side": order.side,
                    "qty": f.qty,
                    "price": f.price,
                    "fee": f.fee,
                    "ts_event_ns": f.ts_ns,
                }
            )
        ledger_ids = {
            r[0]: r[1]
            for r in insert_ignoring_conflicts(session, FillRow, rows, ["fill_id"], ["fill_id", "id"])
        }
        duplicates = [f for f in batch if f.fill_id not in ledger_ids]
        if duplicates:
            stored = _stored(session, FillRow, "fill_id", [f.fill_id for f in duplicates])
            for fill in duplicates:
                if not same_fill(stored[fill.fill_id], fill):
                    raise InvalidRecord(f"fill_id {fill.fill_id} was already recorded with different content")
        new = sorted((f for f in batch if f.fill_id in ledger_ids), key=lambda f: ledger_ids[f.fill_id])
        touched: dict[str, _OrderState] = {}
        for fill in new:
            order = orders[fill.client_order_id]
            order.filled_qty += fill.qty
            if order.filled_qty > order.qty:
                raise InvalidRecord(
                    f"fill {fill.fill_id} over-fills order {order.client_order_id} "
                    f"({order.filled_qty} > {order.qty})"
                )
            if order.status not in ("cancelled", "rejected"):
                order.status = "filled" if order.filled_qty == order.qty else "partially_filled"
            order.ts_updated_ns = max(order.ts_updated_ns, fill.ts_ns)
            touched[order.client_order_id] = order
        if touched:
            session.execute(
                update(OrderRow),
                [
                    {
                        "id": o.id,
                        "filled_qty": o.filled_qty,
                        "status": o.status,
                        "ts_updated_ns": o.ts_updated_ns,
                    }
                    for o in touched.values()
                ],
            )
        self._apply_to_positions(
            session, [(orders[f.client_order_id], f, ledger_ids[f.fill_id]) for f in new]
        )
        return FillsResult(
            inserted=tuple(f.fill_id for f in new), duplicates=tuple(f.fill_id for f in duplicates)
        )

    @staticmethod
    def _apply_to_positions(session: Session, applied: list[tuple[_OrderState, LedgerFill, int]]) -> None:
        keys = sorted({(o.account, o.instrument_id) for o, _, _ in applied})
        if not keys:
            return
        insert_ignoring_conflicts(
            session,
            PositionRow,
            [
                {
                    "account": a,
                    "instrument_id": i,
                    "qty": 0,
                    "avg_price": 0.0,
                    "realized_points": 0.0,
                    "fees": 0.0,
                    "last_fill_id": 0,
                }
                for a, i in keys
            ],
            ["account", "instrument_id"],
        )
        for account, instrument_id in keys:
            row = session.get(
                PositionRow, (account, instrument_id), with_for_update=True, populate_existing=True
            )
            if row is None:
                raise StorageError(f"position row {account}/{instrument_id} vanished inside its transaction")
            state = position_state(row)
            for order, fill, ledger_id in applied:
                if (order.account, order.instrument_id) == (account, instrument_id):
                    state = apply_fill(
                        state,
                        side=cast(Side, order.side),
                        qty=fill.qty,
                        price=fill.price,
                        fee=fill.fee,
                        ledger_id=ledger_id,
                    )
            store_position(row, state)

    def fills(
        self, *, account: str | None = None, after_id: int = 0, limit: int = 10_000
    ) -> list[FillRecord]:
        """Fills with ledger ``id > after_id`` in recording order (paginate with the last id)."""

        def work(session: Session) -> list[FillRecord]:
            query = select(FillRow).where(FillRow.id > after_id).order_by(FillRow.id).limit(limit)
            if account is not None:
                query = query.where(FillRow.account == account)
            return [fill_record(r) for r in session.scalars(query)]

        return self._db.read(work, what="read fills")

    def count_fills(self, account: str | None = None) -> int:
        """How many fills are stored (for one account or all)."""

        def work(session: Session) -> int:
            query = select(func.count()).select_from(FillRow)
            if account is not None:
                query = query.where(FillRow.account == account)
            return int(session.scalar(query) or 0)

        return self._db.read(work, what="count fills")

    # positions ------------------------------------------------------------------------------

    def positions(self, account: str = "default") -> dict[int, PositionState]:
        """Current positions of ``account`` by instrument id (as maintained with the fills)."""

        def work(session: Session) -> dict[int, PositionState]:
            rows = session.scalars(select(PositionRow).where(PositionRow.account == account))
            return {r.instrument_id: position_state(r) for r in rows}

        return self._db.read(work, what="read positions")

    def rebuild(self, account: str = "default") -> LedgerState:
        """Recompute positions and open orders of ``account`` from its fills (restart recovery).

        Orders' filled quantities and the ``positions`` table are repaired where they disagree
        with the fills (each repair is logged); the returned state is what the daemon starts
        from. One write transaction, so concurrent fills are either all counted or not at all.
        """
        return self._db.write(lambda s: self._rebuild(s, account), what="rebuild ledger state")

    def _rebuild(self, session: Session, account: str) -> LedgerState:
        states: dict[int, PositionState] = {}
        filled: dict[str, int] = {}
        query = (
            select(FillRow)
            .where(FillRow.account == account)
            .order_by(FillRow.id)
            .execution_options(yield_per=5000)
        )
        for fill in session.scalars(query):
            state = states.get(fill.instrument_id) or PositionState(
                account=account, instrument_id=fill.instrument_id
            )
            states[fill.instrument_id] = apply_fill(
                state,
                side=cast(Side, fill.side),
                qty=fill.qty,
                price=fill.price,
                fee=fill.fee,
                ledger_id=fill.id,
            )
            filled[fill.client_order_id] = filled.get(fill.client_order_id, 0) + fill.qty
        for order in session.scalars(select(OrderRow).where(OrderRow.account == account).with_for_update()):
            qty = filled.get(order.client_order_id, 0)
            if qty != order.filled_qty:
                log.warning(
                    "order %s: filled_qty %d disagreed with its fills (%d); repaired",
                    order.client_order_id,
                    order.filled_qty,
                    qty,
                )
                order.filled_qty = qty
                if order.status not in ("cancelled", "rejected") and qty > 0:
                    order.status = "filled" if qty >= order.qty else "partially_filled"
        stored = {
            r.instrument_id: r
            for r in session.scalars(
                select(PositionRow).where(PositionRow.account == account).with_for_update()
            )
        }
        for instrument_id, state in states.items():
            row = stored.get(instrument_id)
            if row is None:
                session.add(PositionRow(**{f: getattr(state, f) for f in PositionState.__struct_fields__}))
                continue
            if position_state(row) != state:
                log.warning("position %s/%d disagreed with the fills; repaired", account, instrument_id)
                store_position(row, state)
        for instrument_id in set(stored) - set(states):
            log.warning("position %s/%d has no fills behind it; removed", account, instrument_id)
            session.delete(stored[instrument_id])
        session.flush()
        open_orders = session.scalars(
            select(OrderRow)
            .where(OrderRow.account == account, OrderRow.status.in_(OPEN_ORDER_STATUSES))
            .order_by(OrderRow.id)
        )
        return LedgerState(
            account=account,
            positions=states,
            open_orders=tuple(order_record(o) for o in open_orders),
        )
