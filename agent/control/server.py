"""The daemon's control socket: a ZeroMQ ROUTER answering one JSON reply per JSON request.

Security (DESIGN section 11), bound by :class:`agent.control.endpoints.ServerSockets` (the
same rules as telemetry): an ``ipc://`` endpoint lives in an owner-only directory (0700) and the
socket file is 0600, so another user cannot connect; a ``tcp://`` endpoint is only accepted with
CURVE: the server's secret certificate plus a directory of authorised client public
certificates (``zmq.auth``); a client without a valid, authorised key never completes the
handshake and gets no answer. The handler sees who asked in ``ControlRequest.origin``: what the
client declares (user, host, pid) and, over tcp, the CURVE key it authenticated with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from agent.control.endpoints import ServerSockets
from agent.control.errors import ControlRefused
from agent.control.messages import ControlReply, ControlRequest, decode_request, encode

__all__ = ["ControlServer", "Handler"]

log = logging.getLogger(__name__)

Handler = Callable[[ControlRequest], Awaitable[dict[str, Any]]]
"""Answers one request: returns the result, or raises :class:`ControlRefused` with the reason."""


class ControlServer:
    """Binds the control endpoint and serves requests until :meth:`close`."""

    def __init__(self, servers: ServerSockets, endpoint: str, handler: Handler) -> None:
        self.endpoint = endpoint
        self._servers = servers
        self._handler = handler
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        sock = self._servers.socket(zmq.ROUTER)
        self._servers.bind(sock, self.endpoint, "control")
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="control-server")
        log.info("control socket on %s", self.endpoint)

    async def _serve(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            if len(frames) < 2:
                continue
            reply = await self._answer(frames[-1])
            await self._sock.send_multipart([*frames[:-1], encode(reply)])

    async def _answer(self, frame: zmq.Frame) -> ControlReply:
        try:
            request = decode_request(frame.bytes)
        except msgspec.DecodeError as exc:
            return ControlReply(ok=False, error=f"malformed request: {exc}")
        if self.endpoint.startswith("tcp://"):
            declared = request.origin or "a client"
            key, address = frame.get("User-Id"), frame.get("Peer-Address")
            request = msgspec.structs.replace(request, origin=f"{declared} (CURVE key {key} from {address})")
        try:
            result = await self._handler(request)
        except ControlRefused as exc:
            return ControlReply(ok=False, error=str(exc))
        except Exception as exc:
            log.exception("control command %s failed", request.command)
            return ControlReply(ok=False, error=f"{request.command} failed: {exc}")
        return ControlReply(ok=True, result=result)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
