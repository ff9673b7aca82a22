"""Value types that cross the storage boundary (frozen msgspec Structs, never ORM objects).

Inputs (``LedgerOrder``, ``LedgerFill``, ``InstrumentInfo``) are built by the caller; outputs
(``*Record``, ``PositionState``...) are snapshots read in one transaction. The ORM classes behind
them are the ``*Row`` classes of :mod:`storage.tables`, which never leave ``storage``; the wire
messages of the same orders and fills are :mod:`agent.execution.protocol`'s ``NewOrder`` and
``Fill``. Units follow ``storage.tables``: ``*_ns`` integer ns since the epoch, prices integer
1e-9 fixed point, quantities whole contracts.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

import msgspec

from storage.errors import InvalidRecord

__all__ = [
    "OPEN_ORDER_STATUSES",
    "CheckpointRecord",
    "CheckpointStatus",
    "EventRecord",
    "FillRecord",
    "FillsResult",
    "FloorChange",
    "FloorValue",
    "GateEventRecord",
    "InstrumentInfo",
    "LeaseRecord",
    "LeasedSession",
    "LedgerFill",
    "LedgerOrder",
    "LedgerState",
    "OrderRecord",
    "OrderStatus",
    "PositionState",
    "RunStatus",
    "SessionRecord",
    "Side",
    "instrument_set_key",
]

Side = Literal["buy", "sell"]
OrderStatus = Literal["new", "acked", "partially_filled", "filled", "cancelled", "rejected"]
CheckpointStatus = Literal["candidate", "promoted", "retired", "rejected"]
RunStatus = Literal["running", "succeeded", "failed", "halted"]

OPEN_ORDER_STATUSES: tuple[OrderStatus, ...] = ("new", "acked", "partially_filled")


def instrument_set_key(symbols: Iterable[str]) -> str:
    """The canonical key of a set of instruments (``ModelRegistry``'s ``instrument_set``).

    Sorted, de-duplicated, comma-joined symbols: ``["NQ", "ES", "ES"] -> "ES,NQ"``.
    """
    cleaned = sorted({s.strip() for s in symbols if s.strip()})
    if not cleaned or any("," in s for s in cleaned):
        raise InvalidRecord(f"an instrument set needs symbols without commas, got {cleaned!r}")
    return ",".join(cleaned)


class InstrumentInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An instrument the ledger may trade (Databento instrument id and symbol)."""

    instrument_id: int
    symbol: str
    tick_size: float
    tick_value: float
    """Currency value of one tick for one contract."""


class LedgerOrder(msgspec.Struct, frozen=True, kw_only=True):
    """An order to record before it is sent. ``client_order_id`` is unique forever (idempotency key)."""

    client_order_id: str
    instrument_id: int
    side: Side
    qty: int
    ts_ns: int
    """When the order was created (market/simulated time, ns)."""
    order_type: Literal["market", "limit"] = "market"
    limit_price: int | None = None
    """1e-9 fixed point; required for limit orders."""
    account: str = "default"
    session_id: int | None = None


class OrderRecord(msgspec.Struct, frozen=True, kw_only=True):
    client_order_id: str
    instrument_id: int
    side: Side
    qty: int
    filled_qty: int
    order_type: Literal["market", "limit"]
    limit_price: int | None
    status: OrderStatus
    account: str
    session_id: int | None
    ts_created_ns: int
    ts_updated_ns: int
    reason: str | None


class LedgerFill(msgspec.Struct, frozen=True, kw_only=True):
    """An execution to record. ``fill_id`` is unique forever: recording it twice stores it once.

    Instrument, side and account are those of the order ``client_order_id`` (recorded first).
    """

    fill_id: str
    client_order_id: str
    qty: int
    price: int
    """1e-9 fixed point, as in DBN."""
    ts_ns: int
    fee: float = 0.0
    """Currency, for the whole fill."""


class FillRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    """Ledger sequence number (order of recording)."""
    fill_id: str
    client_order_id: str
    account: str
    instrument_id: int
    side: Side
    qty: int
    price: int
    fee: float
    ts_ns: int


class FillsResult(msgspec.Struct, frozen=True, kw_only=True):
    """What ``Ledger.record_fills`` committed: new fills, and those already stored before."""

    inserted: tuple[str, ...]
    duplicates: tuple[str, ...]


class PositionState(msgspec.Struct, frozen=True, kw_only=True):
    """Net position of one account in one instrument (average-cost accounting).

    ``qty`` signed contracts; ``avg_price`` price units (not fixed point) of the open quantity
    (0 when flat); ``realized_points`` closed P&L in price units x contracts (multiply by
    tick_value / tick_size for currency); ``fees`` currency; ``last_fill_id`` the ledger id of
    the last fill counted.
    """

    account: str
    instrument_id: int
    qty: int = 0
    avg_price: float = 0.0
    realized_points: float = 0.0
    fees: float = 0.0
    last_fill_id: int = 0


class LedgerState(msgspec.Struct, frozen=True, kw_only=True):
    """Positions and open orders of one account, as rebuilt from the ledger after a restart."""

    account: str
    positions: dict[int, PositionState]
    open_orders: tuple[OrderRecord, ...]


class CheckpointRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    sha256: str
    instrument_set: str
    layout_fingerprint: str
    path: str
    metrics: dict[str, Any]
    status: CheckpointStatus
    run_id: int | None
    created_at: datetime
    promoted_at: datetime | None
    promoted_by: str | None
    retired_at: datetime | None
    reject_reason: str | None
    replaced_sha256: str | None
    """The checkpoint that was promoted before this one (where a rollback returns to)."""


class GateEventRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    run_id: int
    kind: str
    passed: bool
    values: dict[str, Any]
    fold_index: int | None
    epoch: int | None
    message: str
    created_at: datetime


class FloorValue(msgspec.Struct, frozen=True, kw_only=True):
    """The current value of a learned floor and where it came from."""

    instrument_id: int
    name: str
    value: float
    run_id: int | None
    source: str
    updated_at: datetime


class FloorChange(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a learned floor's history."""

    instrument_id: int
    name: str
    value: float
    previous_value: float | None
    run_id: int | None
    source: str
    created_at: datetime


class EventRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    kind: str
    message: str
    created_at: datetime
    session_id: int | None
    instrument_id: int | None
    checkpoint_id: int | None
    details: dict[str, Any]


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One run of the daemon (or of a backtest); ``ended_at`` is None while it is open."""

    id: int
    mode: str
    host: str
    pid: int
    version: str
    started_at: datetime
    ended_at: datetime | None
    end_reason: str | None


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds the lease of an account's instrument (``storage.leases``)."""

    account: str
    instrument_id: int
    session_id: int
    host: str
    pid: int
    acquired_at: datetime
    heartbeat_at: datetime
    """Last renewal, on the database's clock (PostgreSQL ``now()``; SQLite: the host's)."""


class LeasedSession(msgspec.Struct, frozen=True, kw_only=True):
    """A daemon session started with its leases (``Leases.start_session``)."""

    session_id: int
    taken_over: tuple[LeaseRecord, ...]
    """One lease per previous holder whose leases this session took over (it had not stopped
    cleanly: its process was gone or its heartbeat stale); their sessions are now closed."""
