"""A private, throwaway PostgreSQL cluster that a test may stop and start at will.

``initdb`` + ``pg_ctl`` from ``/usr/lib/postgresql/<version>/bin`` (or ``PATH``), trust
authentication, a free port on 127.0.0.1 and a socket directory of its own. PostgreSQL
refuses to run as root, so under root the commands run as the ``postgres`` system user
(``runuser``). Used by the outage test: the database goes away while the ledger is writing.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

__all__ = ["ClusterUnavailable", "PrivateCluster"]


class ClusterUnavailable(RuntimeError):
    """PostgreSQL server binaries are missing or the cluster did not start."""


def _bin_dir() -> Path:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").is_file():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ClusterUnavailable("initdb not found (install the PostgreSQL server package)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateCluster:
    """One PostgreSQL cluster in a temporary directory; ``url`` points at its ``postgres`` db."""

    def __init__(self) -> None:
        self._bin = _bin_dir()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres and shutil.which("runuser") is None:
            raise ClusterUnavailable("running as root without runuser: cannot start PostgreSQL")
        self.root = Path(tempfile.mkdtemp(prefix="tradeagent-pg-"))
        self.port = _free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self._bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise ClusterUnavailable(f"{args[0]} failed: {result.stderr.strip() or result.stdout.strip()}")

    def __enter__(self) -> PrivateCluster:
        if self._as_postgres:
            shutil.chown(self.root, user="postgres", group="postgres")
        try:
            self._run("initdb", "-D", str(self.root / "data"), "-A", "trust", "-U", "postgres", "--no-sync")
            self.start()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.root / "data"),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self.stop()
        except ClusterUnavailable:
            pass  # already stopped by the test
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
