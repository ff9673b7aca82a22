"""Where the daemon's orders go: the in-process paper broker or a ZeroMQ execution gateway.

Both venues take orders and cancels and hand every report (Ack, Reject, Fill, Cancelled) to the
``sink`` callback given at construction, in order, on the event-loop thread. The daemon's sink
writes fills to the ledger before counting them; the venue never drops a report.

* :class:`PaperVenue` wraps :class:`~agent.execution.broker.PaperBroker`; it needs the market
  data (:meth:`Venue.on_records`) because it fills against the book.
* :class:`GatewayVenue` is a DEALER connected to the gateway's ROUTER
  (:mod:`agent.execution.protocol`). It sends ``Hello(account, last_seq)`` at start and again
  while no heartbeat arrives (a restarted gateway learns the account again, and replays the
  reports the daemon has not seen). :attr:`Venue.healthy` is false while heartbeats are missing;
  the daemon sends no new orders then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import zmq
import zmq.asyncio

from agent.execution.broker import PaperBroker
from agent.execution.config import BrokerConfig
from agent.execution.protocol import (
    CancelOrder,
    Heartbeat,
    Hello,
    NewOrder,
    ProtocolError,
    Report,
    decode_gateway,
    encode,
)

__all__ = ["GatewayVenue", "PaperVenue", "ReportSink", "Venue"]

log = logging.getLogger(__name__)

ReportSink = Callable[[Report], None]

_HEARTBEAT_LOST_S = 3.0


class Venue(Protocol):
    """What the daemon needs from an execution venue."""

    @property
    def healthy(self) -> bool:
        """False while orders cannot be sent (gateway unreachable)."""
        ...

    @property
    def external(self) -> bool:
        """True when orders live on outside this process (a gateway): the daemon then commits
        an order to the ledger before sending it (see ``agent.daemon.placement``)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def submit(self, order: NewOrder) -> None: ...

    def cancel(self, request: CancelOrder) -> None: ...

    def on_records(self, records: np.ndarray[Any, np.dtype[np.void]]) -> None:
        """Market data in feed order (the paper venue fills against it; a gateway ignores it)."""
        ...

    def advance(self, now_ns: int) -> None:
        """The feed clock moved to ``now_ns`` without records (quiet feed)."""
        ...


class PaperVenue:
    """The paper broker inside the daemon process."""

    def __init__(self, config: BrokerConfig, instrument_ids: Sequence[int], sink: ReportSink) -> None:
        self._broker = PaperBroker(config, instrument_ids)
        self._sink = sink

    @property
    def healthy(self) -> bool:
        return True

    @property
    def external(self) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _emit(self, reports: list[Report]) -> None:
        for report in reports:
            self._sink(report)

    def submit(self, order: NewOrder) -> None:
        self._emit(self._broker.submit(order))

    def cancel(self, request: CancelOrder) -> None:
        self._emit(self._broker.cancel(request))

    def on_records(self, records: np.ndarray[Any, np.dtype[np.void]]) -> None:
        self._emit(self._broker.on_records(records))

    def advance(self, now_ns: int) -> None:
        self._emit(self._broker.advance(now_ns))


class GatewayVenue:
    """Client side of the gateway protocol (one DEALER socket)."""

    def __init__(
        self, ctx: zmq.asyncio.Context, config: BrokerConfig, sink: ReportSink, last_seq: int = 0
    ) -> None:
        self._ctx = ctx
        self._config = config
        self._sink = sink
        self.last_seq = last_seq
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._last_heartbeat = 0.0
        self.protocol_errors = 0

    @property
    def healthy(self) -> bool:
        return time.monotonic() - self._last_heartbeat < _HEARTBEAT_LOST_S

    @property
    def external(self) -> bool:
        return True

    async def start(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(self._config.gateway_endpoint)
        self._sock = sock
        self._hello()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._receive(), name="gateway-receive"),
            loop.create_task(self._keepalive(), name="gateway-keepalive"),
        ]
        log.info(
            "gateway venue: connecting to %s as account %s",
            self._config.gateway_endpoint,
            self._config.account,
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def _send(self, frame: bytes) -> None:
        assert self._sock is not None, "GatewayVenue.start() first"
        try:
            self._sock.send(frame, flags=zmq.NOBLOCK)
        except zmq.Again:
            # DEALER queues while disconnected up to its HWM; beyond it the daemon sees no Ack
            # and the order stays open (ack timeout halts new orders): never a silent fill.
            log.error("gateway send queue full; the message waits for no one and is lost")

    def _hello(self) -> None:
        self._send(encode(Hello(account=self._config.account, last_seq=self.last_seq)))

    def submit(self, order: NewOrder) -> None:
        self._send(encode(order))

    def cancel(self, request: CancelOrder) -> None:
        self._send(encode(request))

    def on_records(self, records: np.ndarray[Any, np.dtype[np.void]]) -> None:
        return None

    def advance(self, now_ns: int) -> None:
        return None

    async def _receive(self) -> None:
        assert self._sock is not None
        while True:
            frame = await self._sock.recv()
            try:
                message = decode_gateway(frame)
            except ProtocolError as exc:
                self.protocol_errors += 1
                log.error("gateway sent an invalid message (%s); ignored", exc)
                continue
            self._last_heartbeat = time.monotonic()
            if isinstance(message, Heartbeat):
                if message.seq < self.last_seq:
                    # A restarted gateway starts a new journal (it answers Hello with a
                    # heartbeat first); fills stay idempotent by fill id in the ledger.
                    log.warning("gateway journal restarted at seq %d (was %d)", message.seq, self.last_seq)
                    self.last_seq = message.seq
                continue
            if message.seq <= self.last_seq:
                continue  # replayed and already applied
            self.last_seq = message.seq
            try:
                self._sink(message)
            except Exception:
                log.exception("report sink failed on %s", message)

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if not self.healthy:
                self._hello()
