"""Alembic environment: runs migrations on the connection that ``storage.migrate`` passes in.

No ``alembic.ini`` is needed: ``storage.migrate`` builds the Alembic config in code and hands
over an open connection already inside a transaction, so the whole upgrade commits or rolls
back as one unit (SQLite and PostgreSQL both have transactional DDL).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from storage.tables import Base


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        transactional_ddl=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


_connection = context.config.attributes.get("connection")
if not isinstance(_connection, Connection):
    raise RuntimeError("storage.migrations must be run through storage.migrate (no connection given)")
_run(_connection)
