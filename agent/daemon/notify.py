"""systemd notification protocol (``sd_notify``) in a few lines of standard-library socket code.

``$NOTIFY_SOCKET`` names an AF_UNIX datagram socket (a leading ``@`` means the abstract
namespace). Without it (not under systemd) every call is a no-op. ``$WATCHDOG_USEC`` (only when
``$WATCHDOG_PID`` is unset or is this process) gives the watchdog period; the daemon pings at
half of it, and only while its loop and feeds are healthy (DESIGN section 11).
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["Notifier"]

log = logging.getLogger(__name__)


class Notifier:
    """Sends READY / STATUS / WATCHDOG / STOPPING to systemd; silent when not under systemd."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + path[1:] if path.startswith("@") else path
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval_s: float | None = int(usec) / 2e6 if usec.isdigit() and mine else None
        """Half the watchdog timeout, in seconds, or None when the watchdog is off."""
        self._last_status = ""

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` lines; True when a datagram was sent. Errors are logged, never raised."""
        if not self._address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Never block the event loop: a full receiver queue drops the message (logged).
                sock.sendto("\n".join(fields).encode(), socket.MSG_DONTWAIT, self._address)
        except OSError as exc:
            log.warning("sd_notify to %s failed: %s", self._address.lstrip("\0"), exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        self._last_status = status
        return self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        """Send ``STATUS=`` when it differs from the last one sent."""
        if status == self._last_status:
            return False
        self._last_status = status
        return self.notify(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1") if self.watchdog_interval_s is not None else False

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")
