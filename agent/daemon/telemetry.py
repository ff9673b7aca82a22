"""Telemetry: decisions, orders, fills and events published on a ZeroMQ PUB socket.

Each message is two frames: the topic (``decision``, ``order``, ``fill``, ``event``) and a
JSON object. Publishing never blocks the daemon: at the high-water mark the message is dropped
and counted (PUB semantics; a slow subscriber cannot stall trading). Subscribers that join late
miss earlier messages; the ledger, not telemetry, is the record of truth.

The socket is bound by the control socket's rules (:class:`agent.control.endpoints.ServerSockets`):
by default an owner-only ipc socket under ``<data_dir>/run``; ``tcp://`` only with CURVE, so
orders and fills reach authorised subscribers only (a tcp endpoint without keys is refused when
the configuration is loaded).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import zmq

from agent.control.endpoints import ServerSockets

__all__ = ["TOPICS", "Telemetry"]

log = logging.getLogger(__name__)

TOPICS = ("decision", "order", "fill", "event")


class Telemetry:
    """Non-blocking publisher; :attr:`dropped` counts messages lost at the high-water mark."""

    def __init__(self, servers: ServerSockets, endpoint: str, hwm: int = 10_000) -> None:
        self.endpoint = endpoint
        self.dropped = 0
        self._encoder = msgspec.json.Encoder()
        sock = servers.socket(zmq.PUB)
        sock.sndhwm = hwm
        servers.bind(sock, endpoint, "telemetry")
        # A plain (non-asyncio) shadow: send with NOBLOCK never awaits.
        self._sock: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self._owner = sock

    def publish(self, topic: str, payload: msgspec.Struct | dict[str, Any]) -> None:
        try:
            self._sock.send_multipart([topic.encode(), self._encoder.encode(payload)], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._owner.close(linger=0)
