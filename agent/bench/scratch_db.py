"""Throwaway PostgreSQL databases: ``tradeagent bench db --postgres-url`` measures in one, and the
test suite gives each PostgreSQL test its own (the one implementation; it is no part of
``storage``, which the daemon uses).

``scratch_database(admin_url)`` creates a uniquely named database on the server of
``admin_url``, yields its URL, and drops it afterwards (``WITH (FORCE)``: connections left
open by a killed process do not block the drop). The admin role needs CREATEDB.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from storage.errors import DatabaseUnavailable, InvalidDatabaseURL
from storage.url import display_url, mask_secrets, parse_url

__all__ = ["scratch_database"]


@contextmanager
def scratch_database(
    admin_url: str, *, prefix: str = "tradeagent_scratch", template: str | None = None
) -> Iterator[URL]:
    """Create a fresh PostgreSQL database next to ``admin_url``'s; drop it on exit.

    With ``template`` (the name of a database nobody is connected to) the new database is a
    copy of it, e.g. an already migrated one; otherwise it is empty.

    Raises ``DatabaseUnavailable`` when the server cannot be reached or refuses to create it.
    """
    admin = parse_url(admin_url)
    if admin.get_backend_name() != "postgresql":
        raise InvalidDatabaseURL(f"{display_url(admin)}: scratch databases need PostgreSQL")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        try:
            with engine.connect() as connection:
                copy = f' TEMPLATE "{template}"' if template else ""
                connection.execute(text(f'CREATE DATABASE "{name}"{copy}'))
        except SQLAlchemyError as exc:
            detail = mask_secrets(str(getattr(exc, "orig", exc)).strip().splitlines()[0])
            raise DatabaseUnavailable(
                f"cannot create a scratch database on {display_url(admin)}: {detail}"
            ) from None
        try:
            yield admin.set(database=name)
        finally:
            with engine.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()
