"""Fixtures of the storage suite: every database test runs on SQLite and on PostgreSQL.

SQLite is the embedded default (a fresh data directory per test). PostgreSQL is the server
at ``TRADEAGENT_TEST_PG_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``);
each test gets its own database, created (as a copy of a migrated template made once per
session) and dropped by :func:`agent.bench.scratch_db.scratch_database`. Without a reachable server
the PostgreSQL cases skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.bench.scratch_db import scratch_database
from storage import Database, Instruments, StorageConfig, open_database
from storage.errors import DatabaseUnavailable
from storage.schema import upgrade
from storage.values import InstrumentInfo
from tests.conftest import PG_URL, skip_or_fail

ES = InstrumentInfo(instrument_id=1001, symbol="ES", tick_size=0.25, tick_value=12.5)
NQ = InstrumentInfo(instrument_id=1002, symbol="NQ", tick_size=0.25, tick_value=5.0)


@dataclass(frozen=True)
class Target:
    """Where a test's database lives: what a process needs to open it."""

    kind: str
    config: StorageConfig
    data_dir: Path

    def open(self) -> Database:
        """Open (and for SQLite create and migrate) the database, as a process would."""
        return open_database(self.config, self.data_dir)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[tuple[str | None, str]]:
    """(name of a migrated PostgreSQL database to copy per test, or None; why not)."""
    try:
        with scratch_database(PG_URL, prefix="tradeagent_template") as url:
            config = StorageConfig(url=url.render_as_string(hide_password=False))
            with open_database(config, ".", check_schema=False) as database:
                upgrade(database)
            yield url.database, ""
    except DatabaseUnavailable as exc:
        yield None, str(exc)


@pytest.fixture
def pg_url(pg_template: tuple[str | None, str]) -> Iterator[str]:
    """URL of a fresh migrated PostgreSQL database for this test."""
    template, problem = pg_template
    if template is None:
        skip_or_fail(f"PostgreSQL at TRADEAGENT_TEST_PG_URL is not usable: {problem}")
        return
    with scratch_database(PG_URL, prefix="tradeagent_test", template=template) as url:
        yield url.render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """A fresh database of each kind (SQLite: created on first open, as in production)."""
    if request.param == "sqlite":
        return Target("sqlite", StorageConfig(), tmp_path)
    url: str = request.getfixturevalue("pg_url")
    return Target("postgresql", StorageConfig(url=url), tmp_path)


@pytest.fixture
def db(target: Target) -> Iterator[Database]:
    """The target opened, with instruments ES and NQ registered."""
    with target.open() as database:
        Instruments(database).upsert([ES, NQ])
        yield database
