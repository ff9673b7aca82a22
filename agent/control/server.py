"""The daemon's control socket: a ZeroMQ ROUTER answering one JSON reply per JSON request.

Security (DESIGN section 11): an ``ipc://`` endpoint lives in an owner-only directory (0700)
and the socket file is 0600, so another user cannot connect; a ``tcp://`` endpoint is only
accepted with CURVE: the server's secret certificate plus a directory of authorised client
public certificates (``zmq.auth``); a client without a valid, authorised key never completes the
handshake and gets no answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from agent.control.config import ControlConfig
from agent.control.endpoints import prepare_ipc, secure_ipc
from agent.control.errors import ControlError, ControlRefused
from agent.control.messages import ControlReply, ControlRequest, decode_request, encode

__all__ = ["ControlServer", "Handler"]

log = logging.getLogger(__name__)

Handler = Callable[[ControlRequest], Awaitable[dict[str, Any]]]
"""Answers one request: returns the result, or raises :class:`ControlRefused` with the reason."""


class ControlServer:
    """Binds the control endpoint and serves requests until :meth:`close`."""

    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: str, config: ControlConfig, handler: Handler
    ) -> None:
        self.endpoint = endpoint
        self._ctx = ctx
        self._config = config
        self._handler = handler
        self._sock: zmq.asyncio.Socket | None = None
        self._auth: AsyncioAuthenticator | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.linger = 0
        if self.endpoint.startswith("tcp://"):
            self._enable_curve(sock)
        elif not self.endpoint.startswith("ipc://"):
            sock.close()
            raise ControlError(f"control endpoint {self.endpoint!r}: only ipc:// and tcp:// (with CURVE)")
        prepare_ipc(self.endpoint)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise ControlError(f"control endpoint {self.endpoint} cannot be bound: {exc}") from None
        secure_ipc(self.endpoint)
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="control-server")
        log.info("control socket on %s", self.endpoint)

    def _enable_curve(self, sock: zmq.asyncio.Socket) -> None:
        cfg = self._config
        if not (cfg.curve_server_secret_file and cfg.curve_authorized_dir):
            raise ControlError("a tcp:// control endpoint needs CURVE keys (control.curve_* settings)")
        try:
            public, secret = zmq.auth.load_certificate(cfg.curve_server_secret_file)
        except (OSError, ValueError) as exc:
            raise ControlError(f"control.curve_server_secret_file cannot be read: {exc}") from None
        if secret is None:
            raise ControlError(f"{cfg.curve_server_secret_file}: not a secret key certificate")
        self._auth = AsyncioAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=cfg.curve_authorized_dir)
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    async def _serve(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) < 2:
                continue
            reply = await self._answer(frames[-1])
            await self._sock.send_multipart([*frames[:-1], encode(reply)])

    async def _answer(self, frame: bytes) -> ControlReply:
        try:
            request = decode_request(frame)
        except msgspec.DecodeError as exc:
            return ControlReply(ok=False, error=f"malformed request: {exc}")
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
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
