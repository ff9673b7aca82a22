"""One daemon per data directory and ledger: a file lock on this host, leases in the database.

* :class:`DaemonLock`: an exclusive ``flock`` on ``<data_dir>/daemon.lock``, taken before the
  daemon opens its database or touches any socket, and held for the life of the process. The
  OS releases it when the process ends, however it ends, so a SIGKILLed daemon never blocks the
  next start. The file holds the holder's pid and host, which a refused daemon names; it is
  never removed (a process could otherwise lock a file that a newer one replaced). Its
  descriptor is not inherited by subprocesses (the retrain), so no child keeps a dead daemon's
  lock.
* The database lease (:mod:`storage.leases`) refuses a second daemon on another data directory
  or another host sharing the database; :func:`holder_gone` is its check for this host, and
  :func:`lease_refused` the daemon's message when it is refused.

Both refusals raise :class:`DaemonLocked`; the CLI exits 2 with its message.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from agent.errors import AgentError
from storage.errors import LeaseHeld
from storage.values import LeaseRecord

__all__ = ["LOCK_FILE", "DaemonLock", "DaemonLocked", "holder_gone", "lease_refused"]

LOCK_FILE = "daemon.lock"


class DaemonLocked(AgentError):
    """Another daemon holds the data directory's lock or a lease; the message names its pid and host."""


class DaemonLock:
    """The exclusive lock of one data directory; :meth:`acquire` it, :meth:`release` at exit."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: str | Path) -> DaemonLock:
        """Lock ``<data_dir>/daemon.lock`` (the directory created 0700 and the file 0600 if they
        are new) and write this process's pid and host into it; :class:`DaemonLocked` naming
        the holder when another process holds it."""
        path = Path(data_dir) / LOCK_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise DaemonLocked(f"{path}: cannot open the daemon lock file: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DaemonLocked(
                f"{path} is held by another daemon ({holder}): one daemon per data_dir; "
                "stop that one first (tradeagent ctl status answers it)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Unlock (idempotent); the file stays."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _holder(fd: int) -> str:
    """``pid N on host H`` as the holder wrote it into the lock file."""
    fields = os.pread(fd, 512, 0).decode(errors="replace").split()
    if len(fields) != 2 or not fields[0].isdigit():
        return "its pid is not written yet: it is starting"
    return f"pid {fields[0]} on host {fields[1]}"


def holder_gone(lease: LeaseRecord) -> bool:
    """True when the lease's holder was a process of this host that no longer exists (or had
    this process's pid: an earlier run, e.g. in a container). A lease of another host, or of a
    pid that exists (also one reused by an unrelated process), waits until its heartbeat is
    stale."""
    if lease.host != socket.gethostname()[:255]:
        return False
    if lease.pid == os.getpid():
        return True
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, as another user's process
        return False
    return False


def lease_refused(exc: LeaseHeld, lease_timeout_s: float) -> DaemonLocked:
    """The daemon's error for a refused lease: the holder (pid and host) and the remedy."""
    return DaemonLocked(
        f"another daemon trades this ledger: {exc}; stop it first (a lease not renewed for "
        f"daemon.lease_timeout_s = {lease_timeout_s:g} s is taken over)"
    )
