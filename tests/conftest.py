"""Shared test configuration.

Service-backed tests never skip when ``CI=true``: they start the service or fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nats_server import NatsServer, NatsServerUnavailable

IN_CI = os.environ.get("CI", "").lower() == "true"
REPO = Path(__file__).resolve().parent.parent
DBN_SAMPLES = REPO / "tests" / "data" / "dbn-samples"
"""Databento's official DBN sample files, vendored with their licence note."""
PG_URL = os.environ.get("TRADEAGENT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
"""The PostgreSQL server the tests use (CI serves it there)."""


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail under CI, where every service must be there."""
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A private ``nats-server -js`` on a free port (its store under ``tmp_path``); it can be
    killed and restarted on the same port. Missing binary: skip locally, fail under CI."""
    try:
        server = NatsServer(store_dir=tmp_path / "nats")
        server.start()
    except NatsServerUnavailable as exc:
        skip_or_fail(str(exc))
    try:
        yield server
    finally:
        server.close()
