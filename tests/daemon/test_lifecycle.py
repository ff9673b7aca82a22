"""Real processes end to end:

* ``tradeagent run`` under a fake systemd (``NOTIFY_SOCKET`` = a datagram socket this test
  binds, ``WATCHDOG_USEC`` set): READY, WATCHDOG and STOPPING arrive as specified, and SIGTERM
  cancels the resting limit orders, persists and exits 0 within the stop timeout;
* the live path: ``tradeagent run`` with ``broker.mode = "gateway"`` trading through a
  ``tradeagent gateway`` subprocess over ZeroMQ, both on one NATS feed, with the ledger in
  PostgreSQL: fills recorded once, positions and P&L equal to the offline recomputation.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from storage import Ledger, open_database
from tests.daemon.support import (
    DaemonProcess,
    config_text,
    install_model,
    model_checkpoint,
    synth_feed,
    write_config,
)
from tests.daemon.test_session import _ledger_state, _relay, _relay_done, _settled, _stop, _symbols
from tests.support.nats_server import NatsServer

pytestmark = pytest.mark.slow


class _NotifySocket:
    """A datagram socket standing in for systemd's, read by a thread as systemd would."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def close(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        self.sock.close()
        return self.messages


def test_systemd_notifications_and_sigterm_cancel_resting_orders(tmp_path: Path) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    config_path = tmp_path / "paper.toml"
    extra = '\n[broker]\norder_type = "limit"\n'
    source = f'kind = "replay"\npath = "{feed}"\npace = 10.0'
    config = write_config(config_path, config_text(tmp_path / "data", source, extra=extra))
    blob, fingerprint = model_checkpoint()
    install_model(config, blob, fingerprint)
    notify = _NotifySocket(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000"}
    daemon = DaemonProcess(config_path, tmp_path / "daemon.log", env=env)
    try:
        daemon.start()
        # Limit orders quoted at the touch: SIGTERM while some are working.
        before = daemon.wait_until(lambda s: s["counts"].get("orders", 0) >= 4 and s["open_orders"] > 0)
        code = daemon.terminate(timeout=config.daemon.stop_timeout_s + 5)
        assert code == 0, daemon.log_tail()
    finally:
        daemon.close()
        messages = notify.close()
    assert messages[0].startswith("READY=1\nSTATUS=running")
    assert "WATCHDOG=1" in messages
    stopping = [i for i, m in enumerate(messages) if m.startswith("STOPPING=1")]
    assert stopping and all("READY" not in m for m in messages[stopping[0] :])
    database = open_database(config.storage, config.data_dir)
    try:
        ledger = Ledger(database)
        assert ledger.open_orders("paper") == []
        closed = [ledger.order(coid) for coid in before["open_order_ids"]]
    finally:
        database.close()
    # Nothing is left working: what rested at SIGTERM was cancelled (or filled while the cancel
    # was on its way: the paper exchange honours the latency).
    assert closed and all(o.status in ("cancelled", "filled") for o in closed), [
        (o.client_order_id, o.status) for o in closed
    ]


def test_live_path_through_the_reference_gateway_with_postgresql(
    tmp_path: Path, nats_server: NatsServer, pg_url: str
) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    port = _free_port()
    config_path = tmp_path / "live.toml"
    source = f'kind = "nats"\nnats_url = "{nats_server.url}"\ndataset = "SYNTH"\ndurable = "daemon"'
    extra = f'\n[broker]\nmode = "gateway"\ngateway_endpoint = "tcp://127.0.0.1:{port}"\naccount = "paper"\n'
    config = write_config(
        config_path, config_text(tmp_path / "data", source, extra=extra, storage_url=pg_url)
    )
    blob, fingerprint = model_checkpoint()
    install_model(config, blob, fingerprint)
    gateway_log = (tmp_path / "gateway.log").open("ab")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--config", str(config_path), "gateway"],
        stdout=gateway_log,
        stderr=subprocess.STDOUT,
    )
    gateway_log.close()
    daemon = DaemonProcess(config_path, tmp_path / "daemon.log")
    relay: subprocess.Popen[bytes] | None = None
    try:
        daemon.start()
        daemon.wait_until(lambda s: "venue" not in s["halts"], timeout=30)
        relay = _relay(config_path, feed, pace=40.0)
        daemon.wait_until(lambda s: s["counts"].get("fills", 0) >= 5, timeout=60)
        _relay_done(relay, config_path)
        status = _settled(daemon)
        assert daemon.terminate() == 0, daemon.log_tail()
    finally:
        daemon.close()
        if relay is not None:
            _stop(relay)
        gateway.terminate()
        gateway.wait(30)
    assert gateway.returncode == 0, (tmp_path / "gateway.log").read_text()[-3000:]
    positions, realised, n_fills, fill_ids = _ledger_state(config)
    assert n_fills == len(set(fill_ids)) == status["counts"]["fills"]
    assert _symbols(positions) == status["positions"]
    assert realised == pytest.approx(status["realised_pnl"], abs=0.01)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
