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

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.config import Config
from agent.execution.fills import PositionArrays, apply_fills, to_currency
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
from tests.support.nats_server import NatsServer

pytestmark = pytest.mark.slow

ACCOUNT = "paper"


def _nats_source(url: str, durable: str = "daemon") -> str:
    return (
        f'kind = "nats"\nnats_url = "{url}"\ndataset = "SYNTH"\nsymbols = ["ES", "NQ"]\ndurable = "{durable}"'
    )


@pytest.fixture
def feed(tmp_path: Path) -> Path:
    out = tmp_path / "feed"
    synth_feed(out)
    return out


def _relay(config_path: Path, feed: Path, pace: float) -> subprocess.Popen[bytes]:
    log = (config_path.parent / "relay.log").open("ab")
    try:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "agent.cli", "--config", str(config_path), "relay"),
                *("--source", "replay", "--path", str(feed), "--pace", str(pace)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    finally:
        log.close()


def _relay_done(relay: subprocess.Popen[bytes], config_path: Path) -> None:
    code = relay.wait(60)
    assert code == 0, (config_path.parent / "relay.log").read_text(errors="replace")[-3000:]


def _setup(tmp_path: Path, nats: NatsServer, extra: str = "") -> tuple[Path, Config]:
    path = tmp_path / "paper.toml"
    config = write_config(path, config_text(tmp_path / "data", _nats_source(nats.url), extra=extra))
    blob, fingerprint = model_checkpoint()
    install_model(config, blob, fingerprint)
    return path, config


@pytest.fixture
def daemon_log(tmp_path: Path) -> Path:
    return tmp_path / "daemon.log"


def _ledger_state(config: Config) -> tuple[dict[int, int], float, int, list[str]]:
    """Positions, realised P&L net of fees (currency) and fill count from the ledger, and the
    realised P&L recomputed offline from the recorded fills with the shared fill maths."""
    database = open_database(config.storage, config.data_dir)
    try:
        ledger = Ledger(database)
        fills = ledger.fills(account=ACCOUNT)
        positions = ledger.positions(ACCOUNT)
    finally:
        database.close()
    by_id = {s.instrument_id: s for s in INSTRUMENTS}
    stored = sum(
        to_currency(p.realized_points, by_id[i].tick_size, by_id[i].tick_value) - p.fees
        for i, p in positions.items()
    )
    offline = 0.0
    for iid, spec in by_id.items():
        mine = [f for f in fills if f.instrument_id == iid]
        book = PositionArrays.flat(1)
        for f in mine:
            qty = f.qty if f.side == "buy" else -f.qty
            book = apply_fills(book, np.array([float(qty)]), np.array([float(f.price)]))
        offline += float(to_currency(book.realised_px[0], spec.tick_size * 1e9, spec.tick_value))
        offline -= sum(f.fee for f in mine)
        assert positions.get(iid) is None or positions[iid].qty == int(book.position[0])
    assert stored == pytest.approx(offline, abs=1e-6)
    return {i: p.qty for i, p in positions.items()}, stored, len(fills), [f.fill_id for f in fills]


def _symbols(positions: dict[int, int]) -> dict[str, int]:
    names = {s.instrument_id: s.symbol for s in INSTRUMENTS}
    return {names[i]: positions.get(i, 0) for i in names}


def test_paper_session_over_nats_trades_fills_and_records(
    tmp_path: Path, nats_server: NatsServer, feed: Path, daemon_log: Path
) -> None:
    config_path, config = _setup(tmp_path, nats_server)
    daemon = DaemonProcess(config_path, daemon_log)
    relay: subprocess.Popen[bytes] | None = None
    try:
        daemon.start()
        relay = _relay(config_path, feed, pace=40.0)
        _relay_done(relay, config_path)
        daemon.wait_until(lambda s: s["counts"].get("fills", 0) > 0)
        # Wait for the whole feed and a quiet ledger (no order in flight).
        status = _settled(daemon)
        total = int(status["feed"]["records"])
        assert status["counts"]["orders"] > 10 and status["counts"]["fills"] > 10, repr(status)
        assert status["counts"].get("dropped_decisions", 0) == 0
        code = daemon.terminate()
        assert code == 0, daemon.log_tail()
    finally:
        daemon.close()
        if relay is not None:
            _stop(relay)
    positions, realised, n_fills, _ = _ledger_state(config)
    assert n_fills == status["counts"]["fills"]
    assert _symbols(positions) == status["positions"]
    assert realised == pytest.approx(status["realised_pnl"], abs=0.01)
    assert total > 1000


def _settled(daemon: DaemonProcess, settle_s: float = 1.0, timeout_s: float = 60.0) -> dict[str, Any]:
    """The daemon's status once the feed is consumed and trading has settled: no order open
    and records, decisions, orders and fills unchanged for ``settle_s`` (the last bar closes'
    decisions and their fills land after the last record is read); fails after ``timeout_s``."""

    def moving(status: dict[str, Any]) -> tuple[Any, ...]:
        counts = status["counts"]
        return (status["feed"]["records"], counts.get("decisions"), counts.get("orders"), counts.get("fills"))

    last: tuple[Any, ...] = ()
    since = time.monotonic()
    deadline = since + timeout_s
    while True:
        status = daemon.status()
        assert time.monotonic() < deadline, f"never settled: {status}\n{daemon.log_tail()}"
        now = moving(status)
        if now != last or status["open_orders"]:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > settle_s:
            return status
        time.sleep(0.1)


def test_nats_restart_mid_session_reconnects_records_the_gap_and_trades_on(
    tmp_path: Path, nats_server: NatsServer, feed: Path, daemon_log: Path
) -> None:
    config_path, config = _setup(tmp_path, nats_server)
    daemon = DaemonProcess(config_path, daemon_log)
    relay: subprocess.Popen[bytes] | None = None
    try:
        daemon.start()
        relay = _relay(config_path, feed, pace=40.0)  # the 5-minute session in ~8 s
        daemon.wait_until(lambda s: s["counts"].get("fills", 0) >= 3)
        nats_server.kill()
        time.sleep(1.0)
        nats_server.start()
        daemon.wait_until(lambda s: s["counts"].get("feed_reconnected", 0) >= 1, timeout=30)
        before = daemon.status()["counts"]["fills"]
        daemon.wait_until(lambda s: s["counts"]["fills"] > before, timeout=30)
        _relay_done(relay, config_path)
        status = _settled(daemon)
        assert daemon.terminate() == 0, daemon.log_tail()
    finally:
        daemon.close()
        if relay is not None:
            _stop(relay)
    positions, _, n_fills, fill_ids = _ledger_state(config)
    assert len(set(fill_ids)) == n_fills == status["counts"]["fills"]
    assert _symbols(positions) == status["positions"]
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
    daemon = DaemonProcess(config_path, daemon_log)
    restarted = DaemonProcess(config_path, daemon_log)
    relay = _relay(config_path, feed, pace=40.0)
    try:
        daemon.start()
        daemon.wait_until(lambda s: s["counts"].get("fills", 0) >= 5)
        before = daemon.status()  # just before the kill
        daemon.kill()
        positions, realised, n_fills, _ = _ledger_state(config)
        orders_after_kill = len(_ledger_ids(config)[0])
        # Every fill it counted was committed first. Every order it sent is in the ledger but the
        # rows still queued behind their send (paper orders: committed right behind, and lost
        # with the simulated exchange that held them, never filled, if the process dies first).
        assert n_fills >= before["counts"]["fills"]
        queued_rows = before["ledger_backlog"]["kinds"].get("orders", 0)
        assert orders_after_kill >= before["counts"]["orders"] - queued_rows
        restarted.start()
        recovered = restarted.status()["recovered"]
        assert recovered["positions"] == _symbols(positions)
        assert recovered["realised_pnl"] == pytest.approx(realised, abs=0.01)
        assert recovered["open_orders"] == 0  # paper orders of the killed process were closed
        # It trades on from the durable consumer; the ledger stays consistent.
        restarted.wait_until(lambda s: s["counts"].get("fills", 0) >= 1, timeout=30)
        _relay_done(relay, config_path)
        final = _settled(restarted)
        assert restarted.terminate() == 0, restarted.log_tail()
    finally:
        daemon.close()
        restarted.close()
        _stop(relay)
    positions2, _, n_fills2, fill_ids = _ledger_state(config)
    assert len(set(fill_ids)) == n_fills2 == n_fills + final["counts"]["fills"]
    assert n_fills2 >= before["counts"]["fills"]
    assert len(_ledger_ids(config)[0]) == orders_after_kill + final["counts"]["orders"]
    assert _symbols(positions2) == final["positions"]


def _ledger_ids(config: Config) -> tuple[list[str], list[str]]:
    """Every order's and every fill's id in the (SQLite) ledger, one per row."""
    with contextlib.closing(sqlite3.connect(Path(config.data_dir) / "tradeagent.db")) as db:
        orders = [r[0] for r in db.execute("SELECT client_order_id FROM orders")]
        fills = [r[0] for r in db.execute("SELECT fill_id FROM fills")]
    return orders, fills


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
