"""The schema: one SQLAlchemy 2 typed ORM class per table, named after a row of it (``OrderRow``
is a row of ``orders``); the migrations in ``storage/migrations`` create the tables.

Units and conventions:

* ``*_ns`` columns are integer nanoseconds since the UNIX epoch (market or simulated time,
  as in DBN ``ts_event``); ``*_at`` columns are wall-clock UTC timestamps.
* Prices are integers in DBN fixed point (1e-9 units of the quote currency per unit of the
  instrument's price); average prices and P&L in ``positions`` are floats in price units.
* Quantities are whole contracts: positive on orders and fills (``side`` gives the sign),
  signed on positions.

Only ``storage`` imports this module; other packages use the repositories, which hand out the
value types of :mod:`storage.values` instead of rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

__all__ = [
    "CHECKPOINT_STATUSES",
    "ORDER_STATUSES",
    "RUN_STATUSES",
    "Base",
    "CheckpointRow",
    "DaemonLeaseRow",
    "DaemonSessionRow",
    "EventRow",
    "FillRow",
    "FoldRow",
    "GateEventRow",
    "InstrumentRow",
    "LearnedFloorChangeRow",
    "LearnedFloorRow",
    "OrderRow",
    "PositionRow",
    "TrainRunRow",
    "UtcDateTime",
    "utc_now",
]

CHECKPOINT_STATUSES = ("candidate", "promoted", "retired", "rejected")
ORDER_STATUSES = ("new", "acked", "partially_filled", "filled", "cancelled", "rejected")
RUN_STATUSES = ("running", "succeeded", "failed", "halted")


def utc_now() -> datetime:
    """The current wall-clock time, timezone-aware UTC."""
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every dialect (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime refused: pass a timezone-aware UTC value")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UtcDateTime(), dict[str, Any]: JSON()}


class InstrumentRow(Base):
    """A tradable instrument, keyed by its Databento instrument id."""

    __tablename__ = "instruments"
    instrument_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    symbol: Mapped[str] = mapped_column(String(64), unique=True)
    tick_size: Mapped[float] = mapped_column(Float)
    tick_value: Mapped[float] = mapped_column(Float)
    """Currency value of one tick for one contract."""
    created_at: Mapped[datetime] = mapped_column(default=utc_now)


class TrainRunRow(Base):
    """One retrain (walk-forward over the archive) for a set of instruments."""

    __tablename__ = "train_runs"
    __table_args__ = (CheckConstraint(_in("status", RUN_STATUSES), name="status"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instrument_set: Mapped[str] = mapped_column(String(512), index=True)
    status: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(default=utc_now)
    finished_at: Mapped[datetime | None]
    config: Mapped[dict[str, Any]]
    summary: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)


class FoldRow(Base):
    """One walk-forward fold of a run: its train and test spans and test metrics."""

    __tablename__ = "folds"
    __table_args__ = (UniqueConstraint("run_id", "fold_index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("train_runs.id", ondelete="CASCADE"))
    fold_index: Mapped[int] = mapped_column(Integer)
    train_start_ns: Mapped[int] = mapped_column(BigInteger)
    train_end_ns: Mapped[int] = mapped_column(BigInteger)
    test_start_ns: Mapped[int] = mapped_column(BigInteger)
    test_end_ns: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]]


class CheckpointRow(Base):
    """A model checkpoint in the registry (the bytes live in the checkpoint file store).

    At most one row per ``instrument_set`` has status ``promoted``: a partial unique index
    enforces it in the database itself, so two racing promotions cannot both commit.
    """

    __tablename__ = "checkpoints"
    __table_args__ = (
        CheckConstraint(_in("status", CHECKPOINT_STATUSES), name="status"),
        Index(
            "uq_checkpoints_one_promoted_per_set",
            "instrument_set",
            unique=True,
            sqlite_where=text("status = 'promoted'"),
            postgresql_where=text("status = 'promoted'"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("train_runs.id"), index=True)
    instrument_set: Mapped[str] = mapped_column(String(512), index=True)
    layout_fingerprint: Mapped[str] = mapped_column(String(128))
    path: Mapped[str] = mapped_column(String(1024))
    metrics: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    promoted_at: Mapped[datetime | None]
    promoted_by: Mapped[str | None] = mapped_column(String(128))
    retired_at: Mapped[datetime | None]
    reject_reason: Mapped[str | None] = mapped_column(Text)
    replaced_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id"))
    """The checkpoint that was promoted when this one was promoted (the rollback target)."""


class GateEventRow(Base):
    """A training gate that was evaluated: Q-drift halt, a kill criterion, a promotion check."""

    __tablename__ = "gate_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("train_runs.id", ondelete="CASCADE"), index=True)
    fold_index: Mapped[int | None] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))
    passed: Mapped[bool] = mapped_column(Boolean)
    values: Mapped[dict[str, Any]]
    """The numbers the gate looked at (e.g. ``{"q": 3.1, "q_prev": 1.2}``)."""
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utc_now)


class LearnedFloorRow(Base):
    """The current value of a learned floor per instrument and name."""

    __tablename__ = "learned_floors"
    instrument_id: Mapped[int] = mapped_column(ForeignKey("instruments.instrument_id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("train_runs.id"))
    source: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(default=utc_now)


class LearnedFloorChangeRow(Base):
    """Every value a learned floor ever took, with the run (provenance) that produced it."""

    __tablename__ = "learned_floor_history"
    __table_args__ = (Index("ix_learned_floor_history_key", "instrument_id", "name", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instrument_id: Mapped[int] = mapped_column(ForeignKey("instruments.instrument_id"))
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    previous_value: Mapped[float | None] = mapped_column(Float)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("train_runs.id"))
    source: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utc_now)


class DaemonSessionRow(Base):
    """One run of the trading daemon (live, paper or backtest)."""

    __tablename__ = "daemon_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(default=utc_now)
    ended_at: Mapped[datetime | None]
    end_reason: Mapped[str | None] = mapped_column(Text)


class DaemonLeaseRow(Base):
    """Which daemon session trades an account's instrument: one holder per (account, instrument).

    The holder renews ``heartbeat_at`` while it runs and deletes its rows when it stops
    cleanly; rows left behind belong to a process that did not (``storage.leases``).
    """

    __tablename__ = "daemon_leases"
    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    instrument_id: Mapped[int] = mapped_column(ForeignKey("instruments.instrument_id"), primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("daemon_sessions.id"))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]


class OrderRow(Base):
    """An order as the daemon sent it, with its latest status and filled quantity."""

    __tablename__ = "orders"
    __table_args__ = (
        CheckConstraint(_in("status", ORDER_STATUSES), name="status"),
        CheckConstraint("side IN ('buy', 'sell')", name="side"),
        CheckConstraint("qty > 0", name="qty_positive"),
        CheckConstraint("filled_qty >= 0 AND filled_qty <= qty", name="filled_qty_range"),
        Index("ix_orders_account_status", "account", "status"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    client_order_id: Mapped[str] = mapped_column(String(64), unique=True)
    session_id: Mapped[int | None] = mapped_column(ForeignKey("daemon_sessions.id"))
    account: Mapped[str] = mapped_column(String(64))
    instrument_id: Mapped[int] = mapped_column(ForeignKey("instruments.instrument_id"))
    side: Mapped[str] = mapped_column(String(4))
    qty: Mapped[int] = mapped_column(Integer)
    order_type: Mapped[str] = mapped_column(String(8))
    limit_price: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    filled_qty: Mapped[int] = mapped_column(Integer, default=0)
    ts_created_ns: Mapped[int] = mapped_column(BigInteger)
    ts_updated_ns: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str | None] = mapped_column(Text)


class FillRow(Base):
    """An execution, stored once per ``fill_id``; instrument, side and account come from its order."""

    __tablename__ = "fills"
    __table_args__ = (
        CheckConstraint("qty > 0", name="qty_positive"),
        Index("ix_fills_account_instrument", "account", "instrument_id", "id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fill_id: Mapped[str] = mapped_column(String(64), unique=True)
    client_order_id: Mapped[str] = mapped_column(ForeignKey("orders.client_order_id"), index=True)
    account: Mapped[str] = mapped_column(String(64))
    instrument_id: Mapped[int] = mapped_column(ForeignKey("instruments.instrument_id"))
    side: Mapped[str] = mapped_column(String(4))
    qty: Mapped[int] = mapped_column(Integer)
    price: Mapped[int] = mapped_column(BigInteger)
    fee: Mapped[float] = mapped_column(Float)
    ts_event_ns: Mapped[int] = mapped_column(BigInteger)


class PositionRow(Base):
    """Net position per account and instrument, kept in step with ``fills`` (rebuildable)."""

    __tablename__ = "positions"
    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    instrument_id: Mapped[int] = mapped_column(ForeignKey("instruments.instrument_id"), primary_key=True)
    qty: Mapped[int] = mapped_column(Integer)
    avg_price: Mapped[float] = mapped_column(Float)
    realized_points: Mapped[float] = mapped_column(Float)
    fees: Mapped[float] = mapped_column(Float)
    last_fill_id: Mapped[int] = mapped_column(BigInteger)
    """``fills.id`` of the last fill counted (fills are applied in ``id`` order)."""


class EventRow(Base):
    """Something operators want in the timeline: halt, gap, reconnect, promotion, swap, rollback."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_kind_id", "kind", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    session_id: Mapped[int | None] = mapped_column(ForeignKey("daemon_sessions.id"))
    instrument_id: Mapped[int | None] = mapped_column(Integer)
    checkpoint_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id"))
    details: Mapped[dict[str, Any]]
