"""Fixtures of the daemon suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.bench.scratch_db import scratch_database
from storage import open_database
from storage.config import StorageConfig
from storage.errors import DatabaseUnavailable
from storage.schema import upgrade
from tests.conftest import PG_URL, skip_or_fail


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database (skipped locally without a server, fails in CI)."""
    try:
        with scratch_database(PG_URL, prefix="tradeagent_daemon") as url:
            text = url.render_as_string(hide_password=False)
            with open_database(StorageConfig(url=text), ".", check_schema=False) as database:
                upgrade(database)
            yield text
    except DatabaseUnavailable as exc:
        skip_or_fail(f"PostgreSQL at TRADEAGENT_TEST_PG_URL is not usable: {exc}")
