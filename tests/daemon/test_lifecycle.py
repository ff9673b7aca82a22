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
    assert_ledger_is,
    daemon_config,
    nats_source,
    relay_done,
    relaying,
    replay_source,
    synth_feed,
)
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
    extra = '\n[broker]\norder_type = "limit"\n'
    config_path, config = daemon_config(tmp_path, replay_source(feed, pace=10.0), extra=extra)
    notify = _NotifySocket(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000"}
    try:
        with DaemonProcess(config_path, tmp_path / "daemon.log", env=env) as daemon:
            daemon.start()
            # Limit orders quoted at the touch: SIGTERM while some are working.
            before = daemon.wait_until(lambda s: s["counts"].get("orders", 0) >= 4 and s["open_orders"] > 0)
            code = daemon.terminate(timeout=config.daemon.stop_timeout_s + 5)
            assert code == 0, daemon.log_tail()
    finally:
        messages = notify.close()
    assert messages[0].startswith("READY=1\nSTATUS=running")
    assert "WATCHDOG=1" in messages
    stopping = [i for i, m in enumerate(messages) if m.startswith("STOPPING=1")]
    assert stopping and all("READY" not in m for m in messages[stopping[0] :])
    with open_database(config.storage, config.data_dir) as database:
        ledger = Ledger(database)
        assert ledger.open_orders("paper") == []
        closed = [ledger.order(coid) for coid in before["open_order_ids"]]
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
    extra = f'\n[broker]\nmode = "gateway"\ngateway_endpoint = "tcp://127.0.0.1:{port}"\naccount = "paper"\n'
    config_path, config = daemon_config(
        tmp_path, nats_source(nats_server.url), extra=extra, storage_url=pg_url
    )
    gateway_log = (tmp_path / "gateway.log").open("ab")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--config", str(config_path), "gateway"],
        stdout=gateway_log,
        stderr=subprocess.STDOUT,
    )
    gateway_log.close()
    try:
        with DaemonProcess(config_path, tmp_path / "daemon.log") as daemon:
            daemon.start()
            daemon.wait_until(lambda s: "venue" not in s["halts"], timeout=30)
            with relaying(config_path, feed, pace=40.0) as relay:
                daemon.wait_until(lambda s: s["counts"].get("fills", 0) >= 5, timeout=60)
                relay_done(relay, config_path)
            status = daemon.finish()
    finally:
        gateway.terminate()
        gateway.wait(30)
    assert gateway.returncode == 0, (tmp_path / "gateway.log").read_text()[-3000:]
    assert_ledger_is(config, status)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
