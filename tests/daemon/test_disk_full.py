"""A full disk under the ledger never loses a row (SQLite's ``max_page_count`` fills it: see
``tests.support.sqlite_full``):

* mid-session (the daemon in-process on a NATS feed relayed by a ``tradeagent relay``
  subprocess): a ``database`` halt naming the disk-full cause and the database file, never a
  ``venue`` halt, no new order, the trading state kept, the pending writes spilled to the spill
  file past ``daemon.write_queue``; once space is freed the backlog is persisted in order, the
  spill file removed, and trading resumes by itself; afterwards the ledger holds exactly the
  orders the daemon sent and the fills it received, each once;
* SIGTERM while the disk is full (a real ``tradeagent run`` subprocess): exit code 1 and a
  message naming the spill file, which holds what the ledger lacks; the next start persists it
  before trading and removes it: the ledger is complete, nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import subprocess
from pathlib import Path

import msgspec
import pytest

from agent.config import Config
from agent.daemon.app import Daemon
from agent.daemon.backlog import OrderRows, read_spill
from agent.execution.protocol import Fill
from feeds.dbn import read_mbp10
from storage import Journal, Ledger, open_database
from tests.daemon.support import (
    INSTRUMENTS,
    DaemonProcess,
    config_text,
    install_model,
    model_checkpoint,
    synth_feed,
    write_config,
)
from tests.daemon.test_daemon import running, wait_for
from tests.daemon.test_session import _ledger_state, _relay, _stop
from tests.support.nats_server import NatsServer
from tests.support.sqlite_full import ENV, PageLimit, installed

pytestmark = pytest.mark.slow

ES = INSTRUMENTS[0].instrument_id


def _setup(tmp_path: Path, source: str) -> tuple[Path, Config]:
    path = tmp_path / "daemon.toml"
    config = write_config(path, config_text(tmp_path / "data", source))
    install_model(config, *model_checkpoint())
    return path, config


def _ledger_ids(config: Config) -> tuple[list[str], list[str]]:
    """Every order's and every fill's id in the ledger (one row each)."""
    with contextlib.closing(sqlite3.connect(Path(config.data_dir) / "tradeagent.db")) as db:
        orders = [r[0] for r in db.execute("SELECT client_order_id FROM orders")]
        fills = [r[0] for r in db.execute("SELECT fill_id FROM fills")]
    return orders, fills


async def _halts_during(daemon: Daemon, seconds: float) -> set[str]:
    """Every halt kind active at some point of the next ``seconds`` (an observation window)."""
    seen: set[str] = set()
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end:
        seen |= set(daemon.halts.active)
        await asyncio.sleep(0.02)
    return seen


async def test_disk_full_mid_session_halts_keeps_every_write_and_resumes_by_itself(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    feed = tmp_path / "feed"
    synth_feed(feed)
    records = read_mbp10(feed)
    source = f'kind = "nats"\nnats_url = "{nats_server.url}"\ndataset = "SYNTH"\ndurable = "daemon"'
    config_path, config = _setup(tmp_path, source)
    spill = tmp_path / "spill"
    config = msgspec.structs.replace(
        config, daemon=msgspec.structs.replace(config.daemon, write_queue=1, spill_dir=str(spill))
    )
    database = Path(config.data_dir) / "tradeagent.db"
    limit = PageLimit(tmp_path / "page-limit")
    relay: subprocess.Popen[bytes] | None = None
    with installed(limit):
        async with running(config) as daemon:
            try:
                relay = _relay(config_path, feed, pace=10.0)  # the 5-minute session in ~30 s
                await wait_for(lambda: daemon.counts["fills"] >= 3, 60)
                limit.fill(database)
                await wait_for(lambda: "database" in daemon.halts.active, 30)
                assert (
                    f"disk full at {database} (database or disk is full)" in daemon.halts.active["database"]
                )
                # An order on its way as the disk filled (sent through the daemon's own path, a
                # limit 40 ticks away: it rests): its row and reports wait behind the refused one.
                book = daemon.features.by_id[ES].book()
                assert book is not None and book.best_bid is not None
                order = daemon.orders.new(
                    ES,
                    "buy",
                    1,
                    ts_ns=daemon._feed_clock_ns,
                    order_type="limit",
                    limit_price=book.best_bid - 40 * 250_000_000,
                )
                daemon._place([order], [0])
                await wait_for(lambda: daemon._writes.spilling, 10)
                backlog = daemon.status()["ledger_backlog"]
                assert backlog["spill_file"] == str(spill / "ledger-spill.jsonl") and backlog["pending"] >= 2
                assert (spill / "ledger-spill.jsonl").exists()
                orders, positions = daemon.counts["orders"], daemon.portfolio.positions()
                # Watched past broker.ack_timeout_s: the answered orders wait for the ledger, the
                # venue is not at fault; nothing trades and nothing counts.
                seen = await _halts_during(
                    daemon, config.broker.ack_timeout_s + 4 * config.daemon.status_interval_s
                )
                assert seen == {"database"}
                assert daemon.counts["orders"] == orders and daemon.portfolio.positions() == positions
                limit.free()
                await wait_for(lambda: not daemon.halts, 30)  # no ctl resume: by itself
                await wait_for(lambda: daemon.counts["orders"] > orders, 30)  # trading again
                assert await asyncio.to_thread(relay.wait, 60) == 0
                await wait_for(lambda: daemon.status()["feed"]["records"] == len(records), 60)
            finally:
                if relay is not None:
                    _stop(relay)
    # Counted after the stop (it persists what is still queued; nothing is left to keep).
    assert not (spill / "ledger-spill.jsonl").exists()
    counts = daemon.counts
    assert counts["fills"] == counts["fills_received"] > 3 and counts["duplicate_fills"] == 0
    assert not [k for k in counts if k.startswith("unrecorded")]
    orders_ids, fill_ids = _ledger_ids(config)
    assert len(orders_ids) == len(set(orders_ids)) == counts["orders"]
    assert order.client_order_id in orders_ids
    assert len(fill_ids) == len(set(fill_ids)) == counts["fills"]
    positions, realised, _, _ = _ledger_state(config)
    assert {i: q for i, q in positions.items() if q} == {
        i: q for i, q in daemon.portfolio.positions().items() if q
    }
    assert realised == pytest.approx(daemon.portfolio.realised(), abs=0.01)


def test_sigterm_while_the_disk_is_full_keeps_the_writes_and_the_next_start_persists_them(
    tmp_path: Path,
) -> None:
    feed = tmp_path / "feed"
    synth_feed(feed)
    config_path, config = _setup(tmp_path, f'kind = "replay"\npath = "{feed}"\npace = 20.0')
    spill = tmp_path / "spill" / "ledger-spill.jsonl"
    limit = PageLimit(tmp_path / "page-limit")
    env = {
        ENV: str(limit.file),
        "TRADEAGENT__DAEMON__WRITE_QUEUE": "4",
        "TRADEAGENT__DAEMON__SPILL_DIR": str(spill.parent),
    }
    first = DaemonProcess(config_path, tmp_path / "first.log", env, module="tests.support.sqlite_full")
    try:
        first.start()
        first.wait_until(lambda s: s["counts"].get("fills", 0) >= 3)
        limit.fill(Path(config.data_dir) / "tradeagent.db")
        halted = first.wait_until(lambda s: "disk full at" in s["halts"].get("database", ""), 60)
        code = first.terminate()
    finally:
        first.close()
    log = first.log_tail(100_000)
    assert code == 1, log
    kept = re.search(
        r"(\d+) ledger writes could not be persisted before the stop deadline: kept in (\S+);", log
    )
    assert kept is not None and kept.group(2) == str(spill), log
    header, entries = read_spill(spill)
    held = list(entries)
    assert len(held) == int(kept.group(1)) > 0 and header.account == "paper"
    kept_orders = {row.client_order_id for e in held if isinstance(e, OrderRows) for row in e.rows}
    kept_fills = {e.fill_id for e in held if isinstance(e, Fill)}
    orders_before, fills_before = _ledger_ids(config)

    limit.free()
    database = open_database(config.storage, config.data_dir)
    try:  # the operator halts before the restart: the next daemon replays, recovers, trades nothing
        Journal(database).record_event("halt", "checking the ledger", details={"kind": "operator"})
    finally:
        database.close()
    second = DaemonProcess(
        config_path, tmp_path / "second.log", env={"TRADEAGENT__DAEMON__SPILL_DIR": str(spill.parent)}
    )
    try:
        second.start()
        recovered = second.status()["recovered"]
        assert not spill.exists()  # persisted, then removed
        assert second.terminate() == 0, second.log_tail()
    finally:
        second.close()
    assert f"persisting the {len(held)} ledger writes a previous process kept in {spill}" in second.log_tail(
        100_000
    )
    orders, fills = _ledger_ids(config)
    assert len(orders) == len(set(orders)) == halted["counts"]["orders"]  # every order sent, once
    assert set(orders) == set(orders_before) | kept_orders
    assert len(fills) == len(set(fills)) >= halted["counts"]["fills_received"]
    assert set(fills) == set(fills_before) | kept_fills and kept_fills - set(fills_before)
    positions, _, _, _ = _ledger_state(config)
    names = {s.instrument_id: s.symbol for s in INSTRUMENTS}
    assert recovered["positions"] == {names[i]: positions.get(i, 0) for i in names}
    database = open_database(config.storage, config.data_dir)
    try:
        ledger = Ledger(database)
        assert sum(f.qty for f in ledger.fills(account="paper")) == sum(
            ledger.order(i).filled_qty for i in set(orders)
        )
    finally:
        database.close()
