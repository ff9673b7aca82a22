"""``tradeagent bench db``: durable fills/s and promotion transactions/s, SQLite and PostgreSQL.

Fills are recorded through :meth:`storage.Ledger.record_fills` in batches (each batch one
committed transaction that also updates the orders and positions), each fill against its own
previously recorded order; promotions are :meth:`storage.ModelRegistry.promote` calls (one
transaction each: candidate -> promoted, previous -> retired, event). SQLite runs in a
temporary directory with the configured durability (``synchronous=FULL`` by default) and,
for comparison, with ``NORMAL``. PostgreSQL runs in a scratch database created next to
``--postgres-url`` and dropped afterwards; its keys are null when the server is unreachable.

Keys: ``sqlite_fills_per_s``, ``sqlite_normal_fills_per_s``, ``postgres_fills_per_s``,
``sqlite_promotions_per_s``, ``postgres_promotions_per_s``, ``fills``, ``batch``,
``promotions``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import tempfile
import time
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import Progress

from agent.bench.scratch_db import scratch_database
from agent.config import Config
from storage import Instruments, Ledger, ModelRegistry, StorageConfig, open_database
from storage.database import Database
from storage.errors import StorageError
from storage.schema import upgrade
from storage.values import InstrumentInfo, LedgerFill, LedgerOrder

__all__ = ["add_arguments", "run"]

log = logging.getLogger(__name__)

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
_INSTRUMENT = InstrumentInfo(instrument_id=1, symbol="BENCH", tick_size=0.25, tick_value=12.5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fills", type=int, default=50_000, help="fills to record per database")
    parser.add_argument("--batch", type=int, default=500, help="fills per committed transaction")
    parser.add_argument("--promotions", type=int, default=300, help="promotions per database")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "TRADEAGENT_BENCH_PG_URL", os.environ.get("TRADEAGENT_TEST_PG_URL", DEFAULT_PG_URL)
        ),
        help="PostgreSQL server to benchmark (a scratch database is created there and dropped)",
    )


def _fills_per_s(database: Database, fills: int, batch: int, label: str) -> float:
    Instruments(database).upsert([_INSTRUMENT])
    ledger = Ledger(database)
    orders = [
        LedgerOrder(client_order_id=f"o{i}", instrument_id=1, side="buy" if i % 2 else "sell", qty=1, ts_ns=i)
        for i in range(fills)
    ]
    for start in range(0, fills, 5_000):
        ledger.record_orders(orders[start : start + 5_000])
    new_fills = [
        LedgerFill(
            fill_id=f"f{i}",
            client_order_id=f"o{i}",
            qty=1,
            price=5_000_000_000_000 + i % 8 * 250_000_000,
            ts_ns=i,
        )
        for i in range(fills)
    ]
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(f"{label} fills", total=fills)
        started = time.perf_counter()
        for start in range(0, fills, batch):
            ledger.record_fills(new_fills[start : start + batch])
            progress.advance(task, batch)
        elapsed = time.perf_counter() - started
    if ledger.count_fills() != fills:
        raise StorageError(f"{label}: benchmark stored {ledger.count_fills()} fills, expected {fills}")
    return fills / elapsed


def _promotions_per_s(database: Database, promotions: int, label: str) -> float:
    registry = ModelRegistry(database)
    hashes = [hashlib.sha256(f"{label}-{i}".encode()).hexdigest() for i in range(promotions)]
    for sha in hashes:
        registry.register_candidate(
            sha256=sha, instrument_set="BENCH", layout_fingerprint="bench", path=sha, metrics={"sharpe": 1.0}
        )
    started = time.perf_counter()
    for sha in hashes:
        registry.promote(sha, by="bench")
    return promotions / (time.perf_counter() - started)


def _sqlite(
    config: StorageConfig, args: argparse.Namespace, synchronous: str, *, promotions: bool
) -> tuple[float, float | None]:
    with tempfile.TemporaryDirectory(prefix="tradeagent-bench-") as tmp:
        storage = msgspec.structs.replace(config, url="", sqlite_synchronous=synchronous)
        with open_database(storage, tmp) as database:
            fills = _fills_per_s(database, args.fills, args.batch, f"sqlite ({synchronous})")
            return fills, _promotions_per_s(database, args.promotions, "sqlite") if promotions else None


def _postgres(config: StorageConfig, args: argparse.Namespace) -> tuple[float | None, float | None]:
    try:
        with scratch_database(args.postgres_url, prefix="tradeagent_bench") as url:
            storage = msgspec.structs.replace(config, url=url.render_as_string(hide_password=False))
            with open_database(storage, ".", check_schema=False) as database:
                upgrade(database)
                return (
                    _fills_per_s(database, args.fills, args.batch, "postgres"),
                    _promotions_per_s(database, args.promotions, "postgres"),
                )
    except StorageError as exc:
        log.warning("PostgreSQL benchmark skipped: %s", exc)
        return None, None


def run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    if args.fills <= 0 or args.batch <= 0 or args.promotions <= 0:
        raise StorageError("--fills, --batch and --promotions must be positive")
    sqlite_fills, sqlite_promotions = _sqlite(config.storage, args, "full", promotions=True)
    sqlite_normal_fills, _ = _sqlite(config.storage, args, "normal", promotions=False)
    postgres_fills, postgres_promotions = _postgres(config.storage, args)
    return {
        "sqlite_fills_per_s": sqlite_fills,
        "sqlite_normal_fills_per_s": sqlite_normal_fills,
        "postgres_fills_per_s": postgres_fills,
        "sqlite_promotions_per_s": sqlite_promotions,
        "postgres_promotions_per_s": postgres_promotions,
        "fills": args.fills,
        "batch": args.batch,
        "promotions": args.promotions,
    }
