"""sd_notify against a datagram socket the test creates as NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from agent.daemon.notify import Notifier


def _receive_all(sock: socket.socket) -> list[str]:
    out = []
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_messages_reach_the_notify_socket_and_watchdog_follows_watchdog_usec(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
        notifier = Notifier(env)
        assert notifier.watchdog_interval_s == 2.0
        assert notifier.ready("trading 2 instruments")
        assert notifier.watchdog()
        assert notifier.status("halted: db")
        assert notifier.stopping()
        assert _receive_all(sock) == [
            "READY=1\nSTATUS=trading 2 instruments",
            "WATCHDOG=1",
            "STATUS=halted: db",
            "STOPPING=1\nSTATUS=stopping",
        ]


def test_abstract_socket_and_watchdog_of_another_pid() -> None:
    name = f"tradeagent-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
        assert notifier.watchdog_interval_s is None  # the watchdog is meant for another process
        assert not notifier.watchdog()
        assert notifier.ready("up")
        assert _receive_all(sock) == ["READY=1\nSTATUS=up"]


def test_without_systemd_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.ready("up") and not notifier.watchdog()
