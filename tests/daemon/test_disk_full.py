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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from agent.config import Config
from agent.daemon.app import Daemon
from agent.daemon.backlog import OrderRows, read_spill
from agent.execution.protocol import Fill, NewOrder
from feeds.dbn import read_mbp10
from storage import Journal, Ledger, open_database
from tests.conftest import skip_or_fail
from tests.daemon.support import (
    INSTRUMENTS,
    DaemonProcess,
    assert_ledger_is,
    by_symbol,
    config_text,
    daemon_config,
    install_model,
    ledger_ids,
    ledger_state,
    model_checkpoint,
    nats_source,
    relay_done,
    relaying,
    replay_source,
    resting_bid,
    running,
    synth_feed,
    write_config,
)
from tests.support.nats_server import NatsServer
from tests.support.sqlite_full import ENV, PageLimit, installed
from tests.support.wait import observed, wait_until, wait_until_async

pytestmark = pytest.mark.slow

ES = INSTRUMENTS[0].instrument_id


@dataclass(frozen=True)
class _Kept:
    """What a stopped daemon kept in its spill file: the account, the number of writes and the
    ids of the orders and of the fills among them."""

    account: str
    writes: int
    orders: set[str]
    fills: set[str]

    @classmethod
    def read(cls, spill: Path) -> _Kept:
        header, entries = read_spill(spill)
        held = list(entries)
        return cls(
            account=header.account,
            writes=len(held),
            orders={row.client_order_id for e in held if isinstance(e, OrderRows) for row in e.rows},
            fills={e.fill_id for e in held if isinstance(e, Fill)},
        )

    def persisted_in(self, log: str, spill: Path) -> bool:
        """Whether the next daemon's ``log`` says it persisted them."""
        return f"persisting the {self.writes} ledger writes a previous process kept in {spill}" in log


def _operator_halt(config: Config) -> None:
    """The operator halts the stopped daemon before its restart (journaled in the ledger)."""
    database = open_database(config.storage, config.data_dir)
    try:
        Journal(database).record_event("halt", "checking the ledger", details={"kind": "operator"})
    finally:
        database.close()


async def _halts_during(daemon: Daemon, seconds: float) -> set[str]:
    """Every halt kind active at some point of the next ``seconds`` (an observation window)."""
    return set().union(*await observed(lambda: set(daemon.halts), seconds))


async def test_disk_full_mid_session_halts_keeps_every_write_and_resumes_by_itself(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    feed = tmp_path / "feed"
    synth_feed(feed)
    records = read_mbp10(feed)
    config_path, config = daemon_config(tmp_path, nats_source(nats_server.url))
    spill = tmp_path / "spill"
    config = msgspec.structs.replace(
        config, daemon=msgspec.structs.replace(config.daemon, write_queue=1, spill_dir=str(spill))
    )
    limit = PageLimit(tmp_path / "page-limit")
    with installed(limit):
        async with running(config) as daemon:
            with relaying(config_path, feed, pace=10.0) as relay:  # the 5-minute session in ~30 s
                await wait_until_async(lambda: daemon.counts["fills"] >= 3, 60, "3 fills")
                limit.fill(Path(config.data_dir) / "tradeagent.db")
                order = await _full_then_freed(daemon, config, limit, resting_bid(feed, ES))
                await asyncio.to_thread(relay_done, relay, config_path)
            await wait_until_async(
                lambda: daemon.status().feed["records"] == len(records), 60, "the whole feed"
            )
    # Counted after the stop (it persists what is still queued; nothing is left to keep).
    assert not (spill / "ledger-spill.jsonl").exists()
    counts = daemon.counts
    assert counts["fills"] == counts["fills_received"] > 3 and counts["duplicate_fills"] == 0
    assert not [k for k in counts if k.startswith("unrecorded")]
    status = {"counts": counts, "positions": by_symbol(daemon.positions), "realised_pnl": daemon.realised_pnl}
    assert_ledger_is(config, status)
    assert order.client_order_id in ledger_ids(config)[0]


async def _full_then_freed(daemon: Daemon, config: Config, limit: PageLimit, limit_price: int) -> NewOrder:
    """With the ledger's disk full: a ``database`` halt naming it, an order sent meanwhile
    (at ``limit_price``: it rests) that waits with its reports in the spill file, and
    nothing trading or counting; once ``limit`` frees the disk, trading resumes by itself. The
    order sent."""
    database = Path(config.data_dir) / "tradeagent.db"
    spill = Path(config.daemon.spill_dir) / "ledger-spill.jsonl"
    await wait_until_async(lambda: "database" in daemon.halts, 30, "a database halt")
    assert f"disk full at {database} (database or disk is full)" in daemon.halts["database"]
    # An order on its way as the disk filled (sent through the daemon's own path): its row and
    # reports wait behind the refused one.
    order = daemon.send_order(ES, "buy", 1, limit_price=limit_price)
    await wait_until_async(lambda: daemon.status().ledger_backlog["spill_file"], 10, "a spill file")
    backlog = daemon.status().ledger_backlog
    assert backlog["spill_file"] == str(spill) and backlog["pending"] >= 2
    assert spill.exists()
    orders, positions = daemon.counts["orders"], daemon.positions
    # Watched past broker.ack_timeout_s: the answered orders wait for the ledger, the venue is
    # not at fault; nothing trades and nothing counts.
    seen = await _halts_during(daemon, config.broker.ack_timeout_s + 4 * config.daemon.status_interval_s)
    assert seen == {"database"}
    assert daemon.counts["orders"] == orders and daemon.positions == positions
    limit.free()
    await wait_until_async(lambda: not daemon.halts, 30, "no halt")  # no ctl resume: by itself
    await wait_until_async(lambda: daemon.counts["orders"] > orders, 30, "a new order")  # trading again
    return order


def test_sigterm_while_the_disk_is_full_keeps_the_writes_and_the_next_start_persists_them(
    tmp_path: Path,
) -> None:
    feed = tmp_path / "feed"
    synth_feed(feed)
    config_path, config = daemon_config(tmp_path, replay_source(feed, pace=20.0))
    spill = tmp_path / "spill" / "ledger-spill.jsonl"
    limit = PageLimit(tmp_path / "page-limit")
    env = {
        ENV: str(limit.file),
        "TRADEAGENT__DAEMON__WRITE_QUEUE": "4",
        "TRADEAGENT__DAEMON__SPILL_DIR": str(spill.parent),
    }
    with DaemonProcess(config_path, tmp_path / "first.log", env, module="tests.support.sqlite_full") as first:
        first.start()
        first.wait_until(lambda s: s["counts"].get("fills", 0) >= 3)
        limit.fill(Path(config.data_dir) / "tradeagent.db")
        halted = first.wait_until(lambda s: "disk full at" in s["halts"].get("database", ""), 60)
        code = first.terminate()
    log = first.log_tail(100_000)
    assert code == 1, log
    kept = re.search(
        r"(\d+) ledger writes could not be persisted before the stop deadline: kept in (\S+);", log
    )
    assert kept is not None and kept.group(2) == str(spill), log
    held = _Kept.read(spill)
    assert held.writes == int(kept.group(1)) > 0 and held.account == "paper"
    orders_before, fills_before = ledger_ids(config)

    limit.free()
    _operator_halt(config)  # the next daemon persists, recovers, trades nothing
    spill_dir = {"TRADEAGENT__DAEMON__SPILL_DIR": str(spill.parent)}
    with DaemonProcess(config_path, tmp_path / "second.log", env=spill_dir) as second:
        second.start()
        recovered = second.status()["recovered"]
        assert not spill.exists()  # persisted, then removed
        assert second.terminate() == 0, second.log_tail()
    assert held.persisted_in(second.log_tail(1_000_000), spill)
    orders, fills = ledger_ids(config)
    assert len(orders) == len(set(orders)) == halted["counts"]["orders"]  # every order sent, once
    assert set(orders) == set(orders_before) | held.orders
    assert len(fills) == len(set(fills)) >= halted["counts"]["fills_received"]
    assert set(fills) == set(fills_before) | held.fills and held.fills - set(fills_before)
    assert recovered["positions"] == by_symbol(ledger_state(config)[0])
    with open_database(config.storage, config.data_dir) as database:
        ledger = Ledger(database)
        assert sum(f.qty for f in ledger.fills(account="paper")) == sum(
            ledger.order(i).filled_qty for i in set(orders)
        )


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
    with contextlib.closing(sqlite3.connect(database, timeout=30.0)) as connection:
        wait_until(
            lambda: not connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0],
            30,
            "the WAL checkpointed and truncated",
        )
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


@dataclass(frozen=True)
class _SmallDisk:
    """A daemon whose data directory (SQLite ledger included) is on the small disk, its spill
    directory elsewhere, on a NATS feed: its configuration, environment, ledger and spill file,
    and the synthetic feed to relay."""

    config_path: Path
    config: Config
    env: dict[str, str]
    database: Path
    spill: Path
    feed: Path

    @classmethod
    def make(cls, tmp_path: Path, disk: Path, nats: NatsServer) -> _SmallDisk:
        path = tmp_path / "daemon.toml"
        config = write_config(path, config_text(disk / "data", nats_source(nats.url)))
        install_model(config, *model_checkpoint())
        synth_feed(tmp_path / "feed")
        return cls(
            config_path=path,
            config=config,
            env={"TRADEAGENT__DAEMON__SPILL_DIR": str(tmp_path / "spill")},
            database=Path(config.data_dir) / "tradeagent.db",
            spill=tmp_path / "spill" / "ledger-spill.jsonl",
            feed=tmp_path / "feed",
        )


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
    disk = _SmallDisk.make(tmp_path, small_disk, nats_server)
    with DaemonProcess(disk.config_path, tmp_path / "daemon.log", disk.env) as daemon:
        daemon.start()
        with relaying(disk.config_path, disk.feed, pace=10.0) as relay:
            _disk_full_and_spilled(daemon, disk.database, disk.spill)
            orders = daemon.status()["counts"]["orders"]
            (disk.database.parent / "filler").unlink()
            daemon.wait_until(lambda s: not s["halts"], 60)  # no ctl resume: by itself
            daemon.wait_until(lambda s: s["counts"]["orders"] > orders, 60)  # trading again
            relay_done(relay, disk.config_path)
        status = daemon.finish()
    log = daemon.log_tail(1_000_000)
    assert SHARED_DISK_WARNING not in log
    assert not disk.spill.exists()
    counts = status["counts"]
    assert counts["fills"] == counts["fills_received"] > 3 and counts.get("duplicate_fills", 0) == 0
    assert_ledger_is(disk.config, status)


def test_sigkill_while_the_ledger_disk_is_full_loses_nothing_counted(
    tmp_path: Path, nats_server: NatsServer, small_disk: Path
) -> None:
    disk = _SmallDisk.make(tmp_path, small_disk, nats_server)
    config, spill = disk.config, disk.spill
    with (
        relaying(disk.config_path, disk.feed, pace=10.0),
        DaemonProcess(disk.config_path, tmp_path / "daemon.log", disk.env) as daemon,
        DaemonProcess(disk.config_path, tmp_path / "restarted.log", disk.env) as restarted,
    ):
        daemon.start()
        _disk_full_and_spilled(daemon, disk.database, spill)
        before = daemon.status()["counts"]  # just before the kill
        daemon.kill()
        held = _Kept.read(spill)
        assert held.writes  # the write the full disk refused, at least: on disk, though nothing was kept
        (disk.database.parent / "filler").unlink()
        orders_before, fills_before = ledger_ids(config)
        _operator_halt(config)  # the next daemon persists, recovers, trades nothing
        restarted.start()
        assert not spill.exists()  # persisted, then removed
        recovered = restarted.status()["recovered"]
        assert restarted.terminate() == 0, restarted.log_tail()
    assert held.persisted_in(restarted.log_tail(1_000_000), spill)
    orders, fills = ledger_ids(config)
    assert len(orders) == len(set(orders)) >= before["orders"]
    assert len(fills) == len(set(fills)) >= before["fills_received"]
    assert set(orders) >= set(orders_before) | held.orders
    assert set(fills) >= set(fills_before) | held.fills
    assert recovered["positions"] == by_symbol(ledger_state(config)[0])
