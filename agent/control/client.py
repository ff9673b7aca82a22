"""Client of the control socket (what ``tradeagent ctl`` and the retrain subprocess use).

A blocking DEALER with a timeout: one request, one reply. For ipc endpoints the socket file is
checked first, so "not running" and "permission denied" are told apart instead of timing out.
"""

from __future__ import annotations

import getpass
import os
import socket
from typing import Any

import msgspec
import zmq

from agent.control.endpoints import CurveClientKeys, apply_client_keys, ipc_path
from agent.control.errors import ControlRefused, ControlUnreachable
from agent.control.messages import Command, ControlRequest, decode_reply, encode

__all__ = ["ControlClient"]


class ControlClient:
    """``request("status")`` -> result dict; raises ControlUnreachable / ControlRefused."""

    def __init__(self, endpoint: str, timeout_s: float = 5.0, curve: CurveClientKeys | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._curve = curve

    def request(self, command: Command, **args: str) -> dict[str, Any]:
        self._check_ipc()
        if self.endpoint.startswith("tcp://") and self._curve is None:
            raise ControlUnreachable(
                f"{self.endpoint}: tcp control needs CURVE keys "
                "(control.curve_client_secret_file and control.curve_server_public_file)"
            )
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        try:
            if self._curve is not None:
                apply_client_keys(sock, self._curve)
            sock.connect(self.endpoint)
            sock.send_multipart([b"", encode(ControlRequest(command=command, args=args, origin=_origin()))])
            if not sock.poll(int(self.timeout_s * 1000)):
                raise ControlUnreachable(
                    f"no answer from the daemon at {self.endpoint} within {self.timeout_s:g} s "
                    "(not running, or not authorised)"
                )
            frames = sock.recv_multipart()
        except zmq.ZMQError as exc:
            raise ControlUnreachable(f"{self.endpoint}: {exc}") from None
        finally:
            sock.close(linger=0)
        try:
            reply = decode_reply(frames[-1])
        except msgspec.DecodeError as exc:
            raise ControlUnreachable(f"{self.endpoint}: malformed reply: {exc}") from None
        if not reply.ok:
            raise ControlRefused(f"{command}: {reply.error}")
        return reply.result

    def _check_ipc(self) -> None:
        path = ipc_path(self.endpoint)
        if path is None:
            return
        if path.parent.exists() and not os.access(path.parent, os.X_OK):
            raise ControlUnreachable(
                f"{path.parent}: permission denied (the daemon's run directory is owner-only)"
            )
        if not path.exists():
            raise ControlUnreachable(f"{path}: no control socket (is the daemon running?)")
        if not os.access(path, os.R_OK | os.W_OK):
            raise ControlUnreachable(f"{path}: permission denied (the control socket is owner-only)")


def _origin() -> str:
    """``user@host pid N`` of this process (what the daemon logs with operator commands)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"
