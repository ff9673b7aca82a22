"""The database goes away while the ledger is writing: retries, FillsNotPersisted, no loss; its
disk fills up: DiskFull at once, the same writes succeed once space is freed."""

from __future__ import annotations

import importlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from storage import Database, Instruments, Ledger, StorageConfig, open_database
from storage.errors import DatabaseUnavailable, DiskFull, FillsNotPersisted
from storage.schema import upgrade
from storage.values import LedgerFill, LedgerOrder
from tests.conftest import skip_or_fail
from tests.storage.conftest import ES
from tests.storage.pg_cluster import ClusterUnavailable, PrivateCluster
from tests.support.sqlite_full import PageLimit, installed

PX = 1_000_000_000


def fills(prefix: str, n: int) -> list[LedgerFill]:
    return [
        LedgerFill(fill_id=f"{prefix}{i}", client_order_id=f"o{prefix}{i}", qty=1, price=5000 * PX, ts_ns=i)
        for i in range(n)
    ]


def prepare(db: Database, prefixes: str) -> Ledger:
    Instruments(db).upsert([ES])
    ledger = Ledger(db)
    ledger.record_orders(
        [
            LedgerOrder(client_order_id=f"o{p}{i}", instrument_id=1001, side="buy", qty=1, ts_ns=i)
            for p in prefixes
            for i in range(10)
        ]
    )
    return ledger


def outage_scenario(db: Database, go_away: Callable[[], None], come_back: Callable[[], None]) -> None:
    """Acknowledge A; lose the database; B fails clearly; B succeeds by retrying while it returns."""
    ledger = prepare(db, "ABC")
    assert ledger.record_fills(fills("A", 10)).inserted == tuple(f"A{i}" for i in range(10))
    go_away()
    db.retry_deadline_s = 1.0
    with pytest.raises(FillsNotPersisted) as info:
        ledger.record_fills(fills("B", 10))
    assert info.value.fill_ids == tuple(f"B{i}" for i in range(10))
    assert info.value.attempts > 1
    db.retry_deadline_s = 60.0
    timer = threading.Timer(1.0, come_back)
    timer.start()
    try:
        result = ledger.record_fills(fills("B", 10) + fills("C", 10))  # held fills re-submitted
    finally:
        timer.join()
    assert len(result.inserted) == 20 and result.duplicates == ()
    assert ledger.count_fills() == 30
    assert ledger.positions()[1001].qty == 30


def test_sqlite_locked_by_another_writer_then_released(tmp_path: Path) -> None:
    db = open_database(StorageConfig(busy_timeout_ms=50), tmp_path)
    blocker = sqlite3.connect(tmp_path / "tradeagent.db", isolation_level=None, check_same_thread=False)

    def go_away() -> None:
        blocker.execute("BEGIN EXCLUSIVE")

    def come_back() -> None:
        blocker.execute("ROLLBACK")

    try:
        outage_scenario(db, go_away, come_back)
    finally:
        blocker.close()
        db.close()


def test_postgres_server_stopped_then_restarted() -> None:
    try:
        cluster = PrivateCluster()
        cluster.__enter__()
    except ClusterUnavailable as exc:
        skip_or_fail(f"cannot run a private PostgreSQL cluster: {exc}")
        return
    try:
        config = StorageConfig(url=cluster.url, connect_timeout_s=1)
        with open_database(config, ".", check_schema=False) as db:
            upgrade(db)
            outage_scenario(db, cluster.stop, cluster.start)
    finally:
        cluster.__exit__(None, None, None)


def test_sqlite_disk_full_is_raised_at_once_and_the_same_writes_succeed_once_space_is_freed(
    tmp_path: Path,
) -> None:
    limit = PageLimit(tmp_path / "page-limit")
    with installed(limit):
        db = open_database(StorageConfig(retry_deadline_s=60.0), tmp_path)
        try:
            ledger = prepare(db, "A")
            limit.fill(tmp_path / "tradeagent.db")
            batches = (
                [
                    LedgerOrder(client_order_id=f"x{k}-{i}", instrument_id=1001, side="buy", qty=1, ts_ns=i)
                    for i in range(50)
                ]
                for k in range(1000)
            )
            stored = 0
            with pytest.raises(DiskFull) as info:
                for batch in batches:
                    ledger.record_orders(batch)
                    stored += len(batch)
            error = info.value
            assert error.attempts == 1  # raised at once, not retried for retry_deadline_s
            assert error.path == str(tmp_path / "tradeagent.db")
            assert f"disk full at {tmp_path / 'tradeagent.db'} (database or disk is full)" in str(error)
            assert isinstance(error, DatabaseUnavailable)  # retryable: nothing of the call was stored
            assert len(ledger.open_orders()) == 10 + stored
            limit.free()
            assert len(ledger.record_orders(batch)) == 50  # the refused batch, now stored
            assert len(ledger.open_orders()) == 10 + stored + 50
        finally:
            db.close()


def test_postgres_disk_full_translates_to_disk_full_naming_the_server() -> None:
    try:
        pg_errors = importlib.import_module("psycopg.errors")
    except ImportError as exc:
        skip_or_fail(f"psycopg (the postgres extra) is not installed: {exc}")
    db = Database(make_url("postgresql+psycopg://trader:secret@db.internal/ledger"), StorageConfig())
    try:
        driver = pg_errors.DiskFull('could not extend file "base/16384/16385": No space left on device')
        error = db.translate(OperationalError("INSERT INTO fills ...", {}, driver), what="record fills")
    finally:
        db.close()
    assert isinstance(error, DiskFull)
    assert error.path == "postgresql+psycopg://trader:***@db.internal/ledger"
    assert 'could not extend file "base/16384/16385"' in str(error) and "secret" not in str(error)
