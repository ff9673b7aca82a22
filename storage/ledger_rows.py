"""The ledger's rows and records: conversions between the ORM rows (:mod:`storage.tables`) and the
values the ledger takes and returns (:mod:`storage.values`), and the checks of what it is asked
to record (integers where prices are fixed point, known sides and order types, bounded ids)."""

from __future__ import annotations

from typing import cast

from storage._sql import finite, nonempty
from storage.errors import InvalidRecord
from storage.tables import FillRow, OrderRow, PositionRow
from storage.values import FillRecord, LedgerFill, LedgerOrder, OrderRecord, OrderStatus, PositionState, Side

__all__ = [
    "UNDEF_PRICE",
    "check_fill",
    "check_order",
    "fill_record",
    "order_record",
    "position_state",
    "same_fill",
    "same_order",
    "store_position",
]

UNDEF_PRICE = 2**63 - 1
"""DBN's "no price" sentinel."""
_ID_MAX = 64


def order_record(row: OrderRow) -> OrderRecord:
    return OrderRecord(
        client_order_id=row.client_order_id,
        instrument_id=row.instrument_id,
        side=cast(Side, row.side),
        qty=row.qty,
        filled_qty=row.filled_qty,
        order_type="limit" if row.order_type == "limit" else "market",
        limit_price=row.limit_price,
        status=cast(OrderStatus, row.status),
        account=row.account,
        session_id=row.session_id,
        ts_created_ns=row.ts_created_ns,
        ts_updated_ns=row.ts_updated_ns,
        reason=row.reason,
    )


def position_state(row: PositionRow) -> PositionState:
    return PositionState(
        account=row.account,
        instrument_id=row.instrument_id,
        qty=row.qty,
        avg_price=row.avg_price,
        realized_points=row.realized_points,
        fees=row.fees,
        last_fill_id=row.last_fill_id,
    )


def store_position(row: PositionRow, state: PositionState) -> None:
    row.qty, row.avg_price, row.fees = state.qty, state.avg_price, state.fees
    row.realized_points, row.last_fill_id = state.realized_points, state.last_fill_id


def fill_record(row: FillRow) -> FillRecord:
    return FillRecord(
        id=row.id,
        fill_id=row.fill_id,
        client_order_id=row.client_order_id,
        account=row.account,
        instrument_id=row.instrument_id,
        side=cast(Side, row.side),
        qty=row.qty,
        price=row.price,
        fee=row.fee,
        ts_ns=row.ts_event_ns,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_order(order: LedgerOrder) -> None:
    nonempty(order.client_order_id, "client_order_id", _ID_MAX)
    if not all(_is_int(v) for v in (order.qty, order.instrument_id, order.ts_ns)) or not (
        order.limit_price is None or _is_int(order.limit_price)
    ):
        raise InvalidRecord(
            f"order {order.client_order_id}: qty, instrument_id, ts_ns and limit_price must be integers "
            "(prices in 1e-9 fixed point)"
        )
    nonempty(order.account, "account", 64)
    if order.side not in ("buy", "sell"):
        raise InvalidRecord(f"order {order.client_order_id}: side must be buy or sell, got {order.side!r}")
    if order.qty <= 0:
        raise InvalidRecord(f"order {order.client_order_id}: qty must be > 0, got {order.qty}")
    if order.order_type not in ("market", "limit"):
        raise InvalidRecord(f"order {order.client_order_id}: order_type must be market or limit")
    if order.order_type == "limit" and (order.limit_price is None or order.limit_price == UNDEF_PRICE):
        raise InvalidRecord(f"order {order.client_order_id}: a limit order needs a limit_price")
    if order.order_type == "market" and order.limit_price is not None:
        raise InvalidRecord(f"order {order.client_order_id}: a market order has no limit_price")


def check_fill(fill: LedgerFill) -> None:
    nonempty(fill.fill_id, "fill_id", _ID_MAX)
    if not all(_is_int(v) for v in (fill.qty, fill.price, fill.ts_ns)):
        raise InvalidRecord(
            f"fill {fill.fill_id}: qty, price and ts_ns must be integers (price in 1e-9 fixed point)"
        )
    if fill.qty <= 0:
        raise InvalidRecord(f"fill {fill.fill_id}: qty must be > 0, got {fill.qty}")
    if abs(fill.price) >= UNDEF_PRICE:
        raise InvalidRecord(f"fill {fill.fill_id}: undefined price")
    finite(fill.fee, f"fill {fill.fill_id} fee")


def same_order(row: OrderRow, order: LedgerOrder) -> bool:
    return (row.instrument_id, row.side, row.qty, row.order_type, row.limit_price, row.account) == (
        order.instrument_id,
        order.side,
        order.qty,
        order.order_type,
        order.limit_price,
        order.account,
    )


def same_fill(row: FillRow, fill: LedgerFill) -> bool:
    return (row.client_order_id, row.qty, row.price, row.fee, row.ts_event_ns) == (
        fill.client_order_id,
        fill.qty,
        fill.price,
        fill.fee,
        fill.ts_ns,
    )
