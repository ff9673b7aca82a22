"""The database goes away while the ledger is writing: retries, FillsNotPersisted, no loss."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import Database, Instruments, Ledger, StorageConfig, open_database
from storage.errors import FillsNotPersisted
from storage.records import NewFill, NewOrder
from storage.schema import upgrade
from tests.conftest import skip_or_fail
from tests.storage.conftest import ES
from tests.storage.pg_cluster import ClusterUnavailable, PrivateCluster

PX = 1_000_000_000


def fills(prefix: str, n: int) -> list[NewFill]:
    return [
        NewFill(fill_id=f"{prefix}{i}", client_order_id=f"o{prefix}{i}", qty=1, price=5000 * PX, ts_ns=i)
        for i in range(n)
    ]


def prepare(db: Database, prefixes: str) -> Ledger:
    Instruments(db).upsert([ES])
    ledger = Ledger(db)
    ledger.record_orders(
        [
            NewOrder(client_order_id=f"o{p}{i}", instrument_id=1001, side="buy", qty=1, ts_ns=i)
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
