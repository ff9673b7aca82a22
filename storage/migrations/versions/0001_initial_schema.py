"""initial schema: instruments, registry, floors, sessions, ledger, events

The partial unique index ``uq_checkpoints_one_promoted_per_set`` is what makes "never more
than one promoted checkpoint per instrument set" a property of the database itself.

Revision ID: 0001
Revises: -
Create Date: 2026-11-30 03:13:40.952272
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "daemon_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_daemon_sessions")),
    )
    op.create_table(
        "instruments",
        sa.Column("instrument_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("symbol", sa.String(length=64), nullable=False),
        sa.Column("tick_size", sa.Float(), nullable=False),
        sa.Column("tick_value", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("instrument_id", name=op.f("pk_instruments")),
        sa.UniqueConstraint("symbol", name=op.f("uq_instruments_symbol")),
    )
    op.create_table(
        "train_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instrument_set", sa.String(length=512), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed', 'halted')", name=op.f("ck_train_runs_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_train_runs")),
    )
    op.create_index(op.f("ix_train_runs_instrument_set"), "train_runs", ["instrument_set"], unique=False)

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("instrument_set", sa.String(length=512), nullable=False),
        sa.Column("layout_fingerprint", sa.String(length=128), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("promoted_by", sa.String(length=128), nullable=True),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reject_reason", sa.Text(), nullable=True),
        sa.Column("replaced_id", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "status IN ('candidate', 'promoted', 'retired', 'rejected')", name=op.f("ck_checkpoints_status")
        ),
        sa.ForeignKeyConstraint(
            ["replaced_id"], ["checkpoints.id"], name=op.f("fk_checkpoints_replaced_id_checkpoints")
        ),
        sa.ForeignKeyConstraint(["run_id"], ["train_runs.id"], name=op.f("fk_checkpoints_run_id_train_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("sha256", name=op.f("uq_checkpoints_sha256")),
    )
    op.create_index(op.f("ix_checkpoints_instrument_set"), "checkpoints", ["instrument_set"], unique=False)
    op.create_index(op.f("ix_checkpoints_run_id"), "checkpoints", ["run_id"], unique=False)
    op.create_index(
        "uq_checkpoints_one_promoted_per_set",
        "checkpoints",
        ["instrument_set"],
        unique=True,
        sqlite_where=sa.text("status = 'promoted'"),
        postgresql_where=sa.text("status = 'promoted'"),
    )

    op.create_table(
        "folds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("fold_index", sa.Integer(), nullable=False),
        sa.Column("train_start_ns", sa.BigInteger(), nullable=False),
        sa.Column("train_end_ns", sa.BigInteger(), nullable=False),
        sa.Column("test_start_ns", sa.BigInteger(), nullable=False),
        sa.Column("test_end_ns", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["train_runs.id"], name=op.f("fk_folds_run_id_train_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_folds")),
        sa.UniqueConstraint("run_id", "fold_index", name=op.f("uq_folds_run_id_fold_index")),
    )
    op.create_table(
        "gate_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("fold_index", sa.Integer(), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["train_runs.id"], name=op.f("fk_gate_events_run_id_train_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gate_events")),
    )
    op.create_index(op.f("ix_gate_events_run_id"), "gate_events", ["run_id"], unique=False)

    op.create_table(
        "learned_floor_history",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instrument_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("previous_value", sa.Float(), nullable=True),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instrument_id"],
            ["instruments.instrument_id"],
            name=op.f("fk_learned_floor_history_instrument_id_instruments"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["train_runs.id"], name=op.f("fk_learned_floor_history_run_id_train_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_learned_floor_history")),
    )
    op.create_index(
        "ix_learned_floor_history_key", "learned_floor_history", ["instrument_id", "name", "id"], unique=False
    )

    op.create_table(
        "learned_floors",
        sa.Column("instrument_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instrument_id"],
            ["instruments.instrument_id"],
            name=op.f("fk_learned_floors_instrument_id_instruments"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["train_runs.id"], name=op.f("fk_learned_floors_run_id_train_runs")
        ),
        sa.PrimaryKeyConstraint("instrument_id", "name", name=op.f("pk_learned_floors")),
    )
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("client_order_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=True),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("instrument_id", sa.Integer(), nullable=False),
        sa.Column("side", sa.String(length=4), nullable=False),
        sa.Column("qty", sa.Integer(), nullable=False),
        sa.Column("order_type", sa.String(length=8), nullable=False),
        sa.Column("limit_price", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("filled_qty", sa.Integer(), nullable=False),
        sa.Column("ts_created_ns", sa.BigInteger(), nullable=False),
        sa.Column("ts_updated_ns", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint("side IN ('buy', 'sell')", name=op.f("ck_orders_side")),
        sa.CheckConstraint(
            "status IN ('new', 'acked', 'partially_filled', 'filled', 'cancelled', 'rejected')",
            name=op.f("ck_orders_status"),
        ),
        sa.CheckConstraint("filled_qty >= 0 AND filled_qty <= qty", name=op.f("ck_orders_filled_qty_range")),
        sa.CheckConstraint("qty > 0", name=op.f("ck_orders_qty_positive")),
        sa.ForeignKeyConstraint(
            ["instrument_id"], ["instruments.instrument_id"], name=op.f("fk_orders_instrument_id_instruments")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["daemon_sessions.id"], name=op.f("fk_orders_session_id_daemon_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_orders")),
        sa.UniqueConstraint("client_order_id", name=op.f("uq_orders_client_order_id")),
    )
    op.create_index("ix_orders_account_status", "orders", ["account", "status"], unique=False)

    op.create_table(
        "positions",
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("instrument_id", sa.Integer(), nullable=False),
        sa.Column("qty", sa.Integer(), nullable=False),
        sa.Column("avg_price", sa.Float(), nullable=False),
        sa.Column("realized_points", sa.Float(), nullable=False),
        sa.Column("fees", sa.Float(), nullable=False),
        sa.Column("last_fill_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["instrument_id"],
            ["instruments.instrument_id"],
            name=op.f("fk_positions_instrument_id_instruments"),
        ),
        sa.PrimaryKeyConstraint("account", "instrument_id", name=op.f("pk_positions")),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=True),
        sa.Column("instrument_id", sa.Integer(), nullable=True),
        sa.Column("checkpoint_id", sa.Integer(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"], ["checkpoints.id"], name=op.f("fk_events_checkpoint_id_checkpoints")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["daemon_sessions.id"], name=op.f("fk_events_session_id_daemon_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_kind_id", "events", ["kind", "id"], unique=False)

    op.create_table(
        "fills",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fill_id", sa.String(length=64), nullable=False),
        sa.Column("client_order_id", sa.String(length=64), nullable=False),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("instrument_id", sa.Integer(), nullable=False),
        sa.Column("side", sa.String(length=4), nullable=False),
        sa.Column("qty", sa.Integer(), nullable=False),
        sa.Column("price", sa.BigInteger(), nullable=False),
        sa.Column("fee", sa.Float(), nullable=False),
        sa.Column("ts_event_ns", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("qty > 0", name=op.f("ck_fills_qty_positive")),
        sa.ForeignKeyConstraint(
            ["client_order_id"], ["orders.client_order_id"], name=op.f("fk_fills_client_order_id_orders")
        ),
        sa.ForeignKeyConstraint(
            ["instrument_id"], ["instruments.instrument_id"], name=op.f("fk_fills_instrument_id_instruments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fills")),
        sa.UniqueConstraint("fill_id", name=op.f("uq_fills_fill_id")),
    )
    op.create_index("ix_fills_account_instrument", "fills", ["account", "instrument_id", "id"], unique=False)
    op.create_index(op.f("ix_fills_client_order_id"), "fills", ["client_order_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_fills_client_order_id"), table_name="fills")
    op.drop_index("ix_fills_account_instrument", table_name="fills")

    op.drop_table("fills")
    op.drop_index("ix_events_kind_id", table_name="events")

    op.drop_table("events")
    op.drop_table("positions")
    op.drop_index("ix_orders_account_status", table_name="orders")

    op.drop_table("orders")
    op.drop_table("learned_floors")
    op.drop_index("ix_learned_floor_history_key", table_name="learned_floor_history")

    op.drop_table("learned_floor_history")
    op.drop_index(op.f("ix_gate_events_run_id"), table_name="gate_events")

    op.drop_table("gate_events")
    op.drop_table("folds")
    op.drop_index(
        "uq_checkpoints_one_promoted_per_set",
        table_name="checkpoints",
        sqlite_where=sa.text("status = 'promoted'"),
        postgresql_where=sa.text("status = 'promoted'"),
    )
    op.drop_index(op.f("ix_checkpoints_run_id"), table_name="checkpoints")
    op.drop_index(op.f("ix_checkpoints_instrument_set"), table_name="checkpoints")

    op.drop_table("checkpoints")
    op.drop_index(op.f("ix_train_runs_instrument_set"), table_name="train_runs")

    op.drop_table("train_runs")
    op.drop_table("instruments")
    op.drop_table("daemon_sessions")
