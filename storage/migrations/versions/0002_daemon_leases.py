"""daemon leases: one daemon session per (account, instrument), with a renewed heartbeat

A row names the session (host, pid) that trades an account's instrument; its holder renews
``heartbeat_at`` and deletes it on a clean stop. Two daemons sharing one database, on one host
or on several, can therefore never trade the same instruments of one account at once.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "daemon_leases",
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("instrument_id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instrument_id"],
            ["instruments.instrument_id"],
            name=op.f("fk_daemon_leases_instrument_id_instruments"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["daemon_sessions.id"], name=op.f("fk_daemon_leases_session_id_daemon_sessions")
        ),
        sa.PrimaryKeyConstraint("account", "instrument_id", name=op.f("pk_daemon_leases")),
    )


def downgrade() -> None:
    op.drop_table("daemon_leases")
