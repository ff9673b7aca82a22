"""Must-hold paper sessions with real processes: nats-server, ``tradeagent relay`` and
``tradeagent run`` subprocesses, the embedded SQLite ledger.

* a session over a replayed synthetic feed relayed through NATS trades, fills and records, and
  its ledger P&L equals the P&L recomputed offline from the recorded fills (with the shared
  fill maths) and the daemon's own figure;
* the NATS server killed and restarted mid-session: the daemon reconnects, records the gap and
  trades again; every fill it counted is in the ledger exactly once;
* the daemon killed with SIGKILL mid-session and restarted: positions and open orders equal the
  ledger's; nothing is counted twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import Config
from storage import Journal, open_database
from tests.daemon.support import (
    DaemonProcess,
    assert_ledger_is,
    by_symbol,
    daemon_config,
    ledger_ids,
    ledger_state,
    nats_source,
    relay_done,
    relaying,
    synth_feed,
)
from tests.support.nats_server import NatsServer

pytestmark = pytest.mark.slow


@pytest.fixture
def feed(tmp_path: Path) -> Path:
    out = tmp_path / "feed"
    synth_feed(out)
    return out


def _setup(tmp_path: Path, nats: NatsServer) -> tuple[Path, Config]:
    return daemon_config(tmp_path, nats_source(nats.url, symbols=("ES", "NQ")))


@pytest.fixture
def daemon_log(tmp_path: Path) -> Path:
    return tmp_path / "daemon.log"


def test_paper_session_over_nats_trades_fills_and_records(
    tmp_path: Path, nats_server: NatsServer, feed: Path, daemon_log: Path
) -> None:
    config_path, config = _setup(tmp_path, nats_server)
    with DaemonProcess(config_path, daemon_log) as daemon:
        daemon.start()
        with relaying(config_path, feed, pace=40.0) as relay:
            relay_done(relay, config_path)
        daemon.wait_until(lambda s: s["counts"].get("fills", 0) > 0)
        # Wait for the whole feed and a quiet ledger (no order in flight).
        status = daemon.finish()
    total = int(status["feed"]["records"])
    assert status["counts"]["orders"] > 10 and status["counts"]["fills"] > 10, repr(status)
    assert status["counts"].get("dropped_decisions", 0) == 0
    assert_ledger_is(config, status)
    assert total > 1000


def test_nats_restart_mid_session_reconnects_records_the_gap_and_trades_on(
    tmp_path: Path, nats_server: NatsServer, feed: Path, daemon_log: Path
) -> None:
    config_path, config = _setup(tmp_path, nats_server)
    with DaemonProcess(config_path, daemon_log) as daemon:
        daemon.start()
        with relaying(config_path, feed, pace=40.0) as relay:  # the 5-minute session in ~8 s
            daemon.wait_until(lambda s: s["counts"].get("fills", 0) >= 3)
            nats_server.kill()
            daemon.wait_until(lambda s: s["counts"].get("feed_disconnected", 0) >= 1, timeout=30)
            nats_server.start()
            daemon.wait_until(lambda s: s["counts"].get("feed_reconnected", 0) >= 1, timeout=30)
            before = daemon.status()["counts"]["fills"]
            daemon.wait_until(lambda s: s["counts"]["fills"] > before, timeout=30)
            relay_done(relay, config_path)
        status = daemon.finish()
    positions, _, n_fills, fill_ids = ledger_state(config)
    assert len(set(fill_ids)) == n_fills == status["counts"]["fills"]
    assert by_symbol(positions) == status["positions"]
    database = open_database(config.storage, config.data_dir)
    try:
        kinds = {e.kind for e in Journal(database).events()}
    finally:
        database.close()
    assert {"disconnected", "reconnected"} <= kinds


def test_sigkill_then_restart_rebuilds_positions_and_orders_from_the_ledger(
    tmp_path: Path, nats_server: NatsServer, feed: Path, daemon_log: Path
) -> None:
    config_path, config = _setup(tmp_path, nats_server)
    with (
        relaying(config_path, feed, pace=40.0) as relay,
        DaemonProcess(config_path, daemon_log) as daemon,
        DaemonProcess(config_path, daemon_log) as restarted,
    ):
        daemon.start()
        daemon.wait_until(lambda s: s["counts"].get("fills", 0) >= 5)
        before = daemon.status()  # just before the kill
        daemon.kill()
        positions, realised, n_fills, _ = ledger_state(config)
        orders_after_kill = len(ledger_ids(config)[0])
        # Every fill it counted was committed first. Every order it sent is in the ledger but the
        # rows still queued behind their send (paper orders: committed right behind, and lost
        # with the simulated exchange that held them, never filled, if the process dies first).
        assert n_fills >= before["counts"]["fills"]
        queued_rows = before["ledger_backlog"]["kinds"].get("orders", 0)
        assert orders_after_kill >= before["counts"]["orders"] - queued_rows
        restarted.start()
        recovered = restarted.status()["recovered"]
        assert recovered["positions"] == by_symbol(positions)
        assert recovered["realised_pnl"] == pytest.approx(realised, abs=0.01)
        assert recovered["open_orders"] == 0  # paper orders of the killed process were closed
        # It trades on from the durable consumer; the ledger stays consistent.
        restarted.wait_until(lambda s: s["counts"].get("fills", 0) >= 1, timeout=30)
        relay_done(relay, config_path)
        final = restarted.finish()
    positions2, _, n_fills2, fill_ids = ledger_state(config)
    assert len(set(fill_ids)) == n_fills2 == n_fills + final["counts"]["fills"]
    assert n_fills2 >= before["counts"]["fills"]
    assert len(ledger_ids(config)[0]) == orders_after_kill + final["counts"]["orders"]
    assert by_symbol(positions2) == final["positions"]
