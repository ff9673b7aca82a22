"""The daemon replaying a recorded day and the event-driven backtest of that day trade the same
way: one trading step (agent/trading) serves both, so their decisions, orders and fills agree
exactly (same instruments, sides, sizes, times, prices and fees), each in its real SQLite ledger.

The daemon runs in-process on the test's loop with its real sockets, the paper broker at the
configured latency and the replay source at full speed; the backtest is
:class:`agent.backtest.event.EventDriver` with the same checkpoint and configuration.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from agent.backtest.event import EventDriver
from agent.daemon.app import Daemon
from agent.model.checkpoint import checkpoint_from_bytes
from agent.trading.decider import ModelDecider
from feeds.dbn import read_mbp10
from storage import open_database
from storage.config import StorageConfig
from tests.daemon.support import (
    INSTRUMENTS,
    config_text,
    install_model,
    model_checkpoint,
    synth_feed,
    write_config,
)

_LOOSE_RISK = """
[risk]
max_daily_loss = 1e12
max_drawdown = 1e12
"""
"""The P&L breaker runs on the daemon's status tick (wall clock) and after each decision in the
backtest: with limits that never bind, every other rule is compared."""


def _orders(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        query = "SELECT instrument_id, side, qty, order_type, ts_created_ns FROM orders"
        return conn.execute(query + " ORDER BY ts_created_ns, id").fetchall()


def _fills(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT instrument_id, side, qty, price, fee, ts_event_ns FROM fills ORDER BY ts_event_ns, id"
        ).fetchall()


async def test_daemon_replay_and_event_backtest_trade_identically(tmp_path: Path) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    source = f'kind = "replay"\npath = "{feed}"\npace = 0.0'
    config = write_config(tmp_path / "daemon.toml", config_text(tmp_path / "data", source, extra=_LOOSE_RISK))
    blob, fingerprint = model_checkpoint(seed=4)
    install_model(config, blob, fingerprint)
    total = int(read_mbp10(feed).shape[0])

    daemon = Daemon(config)
    task = asyncio.create_task(daemon.run())
    try:
        async with asyncio.timeout(300):
            while not (
                daemon.status()["feed"].get("records", 0) >= total
                and daemon._tasks
                and daemon._tasks[0].done()
                and not daemon._writes
                and not daemon.orders.open_orders()
            ):
                if task.done():
                    task.result()
                await asyncio.sleep(0.05)
        decisions = daemon.counts["decisions"]
    finally:
        daemon.request_stop()
        assert await asyncio.wait_for(task, 60) == 0

    scratch = tmp_path / "backtest"
    database = open_database(StorageConfig(), scratch)
    decider = ModelDecider(
        checkpoint_from_bytes(blob),
        config.policy,
        [s.tick_value for s in INSTRUMENTS],
        "cpu",
        fee_per_contract=config.broker.fee_per_contract,
        max_batch=len(INSTRUMENTS),
    )
    try:
        run = await EventDriver(config, INSTRUMENTS, decider, database, [0.0, 0.0]).replay(feed, 0, 2**62)
    finally:
        decider.close()
        database.close()

    daemon_orders, backtest_orders = (
        _orders(Path(config.data_dir) / "tradeagent.db"),
        _orders(scratch / "tradeagent.db"),
    )
    daemon_fills, backtest_fills = (
        _fills(Path(config.data_dir) / "tradeagent.db"),
        _fills(scratch / "tradeagent.db"),
    )
    assert len(backtest_fills) > 20, "the model should trade on this day"
    assert decisions == int(run.log.arrays()["action"].size)
    assert daemon_orders == backtest_orders
    assert daemon_fills == backtest_fills
