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

And on a real small filesystem (a tmpfs mounted for the test: root, which CI is) holding the
daemon's data directory and SQLite ledger, the spill directory elsewhere (no warning at start):

* the disk filled mid-session and freed: the pending writes are spilled (0600) at once, far below
  ``daemon.write_queue``; the daemon resumes by itself; after the stop the ledger holds exactly
  the orders sent and the fills received;
* the disk filled, then SIGKILL: the spill file holds what the ledger lacks, and the next start
  persists it: every order and fill the killed daemon counted is in the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from agent.config import Config
from agent.daemon.app import Daemon
from agent.daemon.backlog import OrderRows, read_spill
from agent.execution.protocol import Fill
from feeds.dbn import read_mbp10
from storage import Journal, Ledger, open_database
from tests.conftest import skip_or_fail
from tests.daemon.support import (
    INSTRUMENTS,
    DaemonProcess,
    config_text,
    install_model,
    model_checkpoint,
    synth_feed,
    write_config,
)
from tests.daemon.test_daemon import resting_bid, running, wait_for
from tests.daemon.test_session import _ledger_ids, _ledger_state, _relay, _relay_done, _settled, _stop
from tests.support.nats_server import NatsServer
from tests.support.sqlite_full import ENV, PageLimit, installed

pytestmark = pytest.mark.slow

ES = INSTRUMENTS[0].instrument_id


def _setup(tmp_path: Path, source: str) -> tuple[Path, Config]:
    path = tmp_path / "daemon.toml"
    config = write_config(path, config_text(tmp_path / "data", source))
    install_model(config, *model_checkpoint())
    return path, config


async def _halts_during(daemon: Daemon, seconds: float) -> set[str]:
    """Every halt kind active at some point of the next ``seconds`` (an observation window)."""
    seen: set[str] = set()
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end:
        seen |= set(daemon.halts)
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
                await wait_for(lambda: "database" in daemon.halts, 30)
                assert f"disk full at {database} (database or disk is full)" in daemon.halts["database"]
                # An order on its way as the disk filled (sent through the daemon's own path, a
                # limit 40 ticks under the day's lowest bid: it rests): its row and reports wait
                # behind the refused one.
                order = daemon.send_order(ES, "buy", 1, limit_price=resting_bid(feed, ES))
                await wait_for(lambda: daemon.status().ledger_backlog["spill_file"], 10)
                backlog = daemon.status().ledger_backlog
                assert backlog["spill_file"] == str(spill / "ledger-spill.jsonl") and backlog["pending"] >= 2
                assert (spill / "ledger-spill.jsonl").exists()
                orders, positions = daemon.counts["orders"], daemon.positions
                # Watched past broker.ack_timeout_s: the answered orders wait for the ledger, the
                # venue is not at fault; nothing trades and nothing counts.
                seen = await _halts_during(
                    daemon, config.broker.ack_timeout_s + 4 * config.daemon.status_interval_s
                )
                assert seen == {"database"}
                assert daemon.counts["orders"] == orders and daemon.positions == positions
                limit.free()
                await wait_for(lambda: not daemon.halts, 30)  # no ctl resume: by itself
                await wait_for(lambda: daemon.counts["orders"] > orders, 30)  # trading again
                assert await asyncio.to_thread(relay.wait, 60) == 0
                await wait_for(lambda: daemon.status().feed["records"] == len(records), 60)
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
    assert {i: q for i, q in positions.items() if q} == {i: q for i, q in daemon.positions.items() if q}
    assert realised == pytest.approx(daemon.realised_pnl, abs=0.01)


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


# ---------------------------------------------------------------- a real small filesystem

SHARED_DISK_WARNING = "is on the filesystem of the SQLite ledger"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted at ``tmp_path / "disk"`` for the test. Mounting needs root: CI
    runs as root, so under ``CI=true`` a failure fails the test (naming the uid when it is not
    root); elsewhere it skips."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        skip_or_fail(f"mounting a tmpfs needs root (CI runs as root; this run has uid {os.geteuid()})")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs on {where} as root: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _fill(database: Path) -> Path:
    """Fill the ledger's filesystem to its last block; the filler file, to delete to free it.

    The WAL is checkpointed and truncated first: SQLite writes into a WAL file's existing
    length without asking for a block, so only a WAL that must grow meets the full disk."""
    deadline = time.monotonic() + 30.0
    with contextlib.closing(sqlite3.connect(database, timeout=30.0)) as connection:
        while connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
            assert time.monotonic() < deadline, "the WAL could not be checkpointed"
    filler = database.parent / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        chunk = 1 << 20
        while chunk:
            try:
                os.write(fd, bytes(chunk))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return filler


def _small_disk_daemon(tmp_path: Path, disk: Path, nats: NatsServer) -> tuple[Path, Config, dict[str, str]]:
    """A daemon whose data directory (SQLite ledger included) is on ``disk``, its spill
    directory elsewhere, on a NATS feed; its config path, config and environment."""
    source = f'kind = "nats"\nnats_url = "{nats.url}"\ndataset = "SYNTH"\ndurable = "daemon"'
    path = tmp_path / "daemon.toml"
    config = write_config(path, config_text(disk / "data", source))
    install_model(config, *model_checkpoint())
    return path, config, {"TRADEAGENT__DAEMON__SPILL_DIR": str(tmp_path / "spill")}


def _disk_full_and_spilled(daemon: DaemonProcess, database: Path, spill: Path) -> None:
    """Fill the ledger's disk once the daemon fills orders; wait for the ``database`` halt
    naming the ledger and for every pending write to be in the spill file."""
    daemon.wait_until(lambda s: s["counts"].get("fills", 0) >= 3)
    filler = _fill(database)
    assert filler.exists()
    halted = daemon.wait_until(lambda s: "disk full at" in s["halts"].get("database", ""), 60)
    assert f"disk full at {database} (database or disk is full)" in halted["halts"]["database"]
    spilled = daemon.wait_until(lambda s: s["ledger_backlog"]["spill_file"] == str(spill), 30)
    backlog = spilled["ledger_backlog"]
    assert 0 < backlog["pending"] < daemon.config.daemon.write_queue  # spilled at once, not past the bound
    assert stat.S_IMODE(spill.stat().st_mode) == 0o600


def test_a_full_ledger_disk_mid_session_spills_at_once_and_resumes_by_itself(
    tmp_path: Path, nats_server: NatsServer, small_disk: Path
) -> None:
    feed = tmp_path / "feed"
    synth_feed(feed)
    config_path, config, env = _small_disk_daemon(tmp_path, small_disk, nats_server)
    database = Path(config.data_dir) / "tradeagent.db"
    spill = tmp_path / "spill" / "ledger-spill.jsonl"
    daemon = DaemonProcess(config_path, tmp_path / "daemon.log", env)
    relay: subprocess.Popen[bytes] | None = None
    try:
        daemon.start()
        relay = _relay(config_path, feed, pace=10.0)
        _disk_full_and_spilled(daemon, database, spill)
        orders = daemon.status()["counts"]["orders"]
        (database.parent / "filler").unlink()
        daemon.wait_until(lambda s: not s["halts"], 60)  # no ctl resume: by itself
        daemon.wait_until(lambda s: s["counts"]["orders"] > orders, 60)  # trading again
        _relay_done(relay, config_path)
        status = _settled(daemon)
        assert daemon.terminate() == 0, daemon.log_tail()
    finally:
        daemon.close()
        if relay is not None:
            _stop(relay)
    log = daemon.log_tail(1_000_000)
    assert SHARED_DISK_WARNING not in log
    assert not spill.exists()
    counts = status["counts"]
    assert counts["fills"] == counts["fills_received"] > 3 and counts.get("duplicate_fills", 0) == 0
    orders_ids, fill_ids = _ledger_ids(config)
    assert len(orders_ids) == len(set(orders_ids)) == counts["orders"]
    assert len(fill_ids) == len(set(fill_ids)) == counts["fills"]
    positions, realised, _, _ = _ledger_state(config)
    names = {s.instrument_id: s.symbol for s in INSTRUMENTS}
    assert {names[i]: positions.get(i, 0) for i in names} == status["positions"]
    assert realised == pytest.approx(status["realised_pnl"], abs=0.01)


def test_sigkill_while_the_ledger_disk_is_full_loses_nothing_counted(
    tmp_path: Path, nats_server: NatsServer, small_disk: Path
) -> None:
    feed = tmp_path / "feed"
    synth_feed(feed)
    config_path, config, env = _small_disk_daemon(tmp_path, small_disk, nats_server)
    database = Path(config.data_dir) / "tradeagent.db"
    spill = tmp_path / "spill" / "ledger-spill.jsonl"
    daemon = DaemonProcess(config_path, tmp_path / "daemon.log", env)
    restarted = DaemonProcess(config_path, tmp_path / "restarted.log", env)
    relay = _relay(config_path, feed, pace=10.0)
    try:
        daemon.start()
        _disk_full_and_spilled(daemon, database, spill)
        before = daemon.status()["counts"]  # just before the kill
        daemon.kill()
        _, kept = read_spill(spill)
        held = list(kept)
        assert held  # the write the full disk refused, at least: on disk, though nothing was kept
        kept_orders = {row.client_order_id for e in held if isinstance(e, OrderRows) for row in e.rows}
        kept_fills = {e.fill_id for e in held if isinstance(e, Fill)}
        (database.parent / "filler").unlink()
        orders_before, fills_before = _ledger_ids(config)
        ledger = open_database(config.storage, config.data_dir)
        try:  # the operator halts before the restart: the next daemon persists, recovers, trades nothing
            Journal(ledger).record_event("halt", "checking the ledger", details={"kind": "operator"})
        finally:
            ledger.close()
        restarted.start()
        assert not spill.exists()  # persisted, then removed
        recovered = restarted.status()["recovered"]
        assert restarted.terminate() == 0, restarted.log_tail()
    finally:
        daemon.close()
        restarted.close()
        _stop(relay)
    assert f"persisting the {len(held)} ledger writes a previous process kept in {spill}" in (
        restarted.log_tail(1_000_000)
    )
    orders, fills = _ledger_ids(config)
    assert len(orders) == len(set(orders)) >= before["orders"]
    assert len(fills) == len(set(fills)) >= before["fills_received"]
    assert set(orders) >= set(orders_before) | kept_orders
    assert set(fills) >= set(fills_before) | kept_fills
    positions, _, _, _ = _ledger_state(config)
    names = {s.instrument_id: s.symbol for s in INSTRUMENTS}
    assert recovered["positions"] == {names[i]: positions.get(i, 0) for i in names}
