"""Schema versions (Alembic, shipped in the package) and opening a database for use.

``open_database`` is the entry point of every process that uses the store:

* the embedded SQLite default (``StorageConfig.url`` empty) is created under the data
  directory (owner-only: a new directory 0700, a new file 0600) and upgraded to head
  automatically, under the database's write lock, so two processes starting at once migrate
  it exactly once;
* any other URL is only checked: a schema behind head stops the process with
  :class:`SchemaBehindHead`, which names ``tradeagent db upgrade``; a schema written by a
  newer version stops it with :class:`SchemaAheadOfCode`.

No ``alembic.ini`` is read: the Alembic configuration is built here with
``script_location = storage:migrations``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from storage.config import StorageConfig
from storage.database import Database
from storage.errors import SchemaAheadOfCode, SchemaBehindHead, StorageError
from storage.url import is_embedded, resolve_url

__all__ = [
    "Revision",
    "current_revision",
    "head_revision",
    "history",
    "open_database",
    "upgrade",
]

log = logging.getLogger(__name__)
# Alembic announces its dialect settings at INFO on every check; this module logs the upgrades.
logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)

SCRIPT_LOCATION = "storage:migrations"
_PG_MIGRATION_LOCK = 0x7472_6164  # pg_advisory_xact_lock key: one migrator at a time


class Revision(msgspec.Struct, frozen=True, kw_only=True):
    """One migration in the shipped history."""

    revision: str
    down_revision: str | None
    message: str
    is_head: bool


def _alembic_config(connection: Connection | None = None) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_alembic_config())


def head_revision() -> str:
    """The revision this code expects (the single head of the shipped history)."""
    head = _scripts().get_current_head()
    if head is None:
        raise StorageError("no migrations shipped in storage/migrations")
    return head


def history() -> list[Revision]:
    """The shipped migrations, newest first."""
    head = head_revision()
    return [
        Revision(
            revision=script.revision,
            down_revision=script.down_revision if isinstance(script.down_revision, str) else None,
            message=(script.doc or "").strip(),
            is_head=script.revision == head,
        )
        for script in _scripts().walk_revisions()
    ]


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def current_revision(database: Database) -> str | None:
    """The revision the database is at (None: empty database, never migrated)."""
    with database.connection(read_only=True) as connection:
        try:
            return _current(connection)
        except SQLAlchemyError as exc:
            raise database.translate(exc, what="read schema revision") from None


def upgrade(database: Database, target: str = "head") -> tuple[str | None, str | None]:
    """Upgrade the schema to ``target`` in one transaction; return (before, after) revisions.

    Concurrent callers are serialised by the database (SQLite write lock, PostgreSQL advisory
    lock): the second one finds the work done.
    """
    with database.connection() as connection:
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
                before = _current(connection)
                command.upgrade(_alembic_config(connection), target)
                after = _current(connection)
        except SQLAlchemyError as exc:
            raise database.translate(exc, what="schema upgrade") from None
    if before != after:
        log.info("schema of %s upgraded from %s to %s", database.display_url, before or "<empty>", after)
    return before, after


def _check(database: Database) -> None:
    current = current_revision(database)
    head = head_revision()
    if current == head:
        return
    known = {r.revision for r in history()}
    if current is not None and current not in known:
        raise SchemaAheadOfCode(
            f"database {database.display_url} is at schema revision {current}, unknown to this "
            f"version of tradeagent (head {head}): upgrade tradeagent"
        )
    raise SchemaBehindHead(
        f"database {database.display_url} is at schema revision {current or '<empty>'}, behind "
        f"head {head}: run `tradeagent db upgrade` (with the same --config / TRADEAGENT_DB_URL)"
    )


def _create_owner_only(path: Path) -> None:
    """Create the embedded database's directory (0700) and its empty file (0600) where they do
    not exist yet, so that a new ledger is its owner's alone (SQLite gives its WAL and shared
    memory files the database file's mode). Existing ones are left as they are: under systemd
    the unit's ``StateDirectoryMode`` and ``UMask`` decide."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise StorageError(f"cannot create the data directory for {path}: {exc}") from None
    os.close(fd)


def open_database(config: StorageConfig, data_dir: str | Path, *, check_schema: bool = True) -> Database:
    """Open the configured database for use, failing fast with a clear error.

    Raises :class:`InvalidDatabaseURL`, :class:`DatabaseUnavailable` (cannot connect now),
    :class:`CorruptDatabase` (SQLite file is not a database; left untouched),
    :class:`SchemaBehindHead` / :class:`SchemaAheadOfCode` (non-embedded URLs). With
    ``check_schema=False`` (the ``tradeagent db`` commands) only connectivity is checked.
    """
    url = resolve_url(config, data_dir)
    embedded = is_embedded(config)
    if embedded and url.database:
        _create_owner_only(Path(url.database))
    database = Database(url, config)
    try:
        database.ping()
        if check_schema:
            try:
                _check(database)
            except SchemaBehindHead:
                if not embedded:
                    raise
                upgrade(database)
    except BaseException:
        database.close()
        raise
    log.debug("opened database %s", database.display_url)
    return database
