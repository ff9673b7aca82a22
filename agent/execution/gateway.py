"""The reference execution gateway: the paper broker behind the ZeroMQ gateway protocol.

``tradeagent gateway`` runs it as its own process, so the live path of the daemon
(``broker.mode = "gateway"``) is exercised end to end exactly as it would talk to a real
gateway. It binds a ROUTER on ``broker.gateway_endpoint``, reads the market data from the
configured source (the same NATS feed the daemon reads) and keeps, per account, one
:class:`~agent.execution.broker.PaperBroker` and a journal of every report it sent.

Protocol duties (:mod:`agent.execution.protocol`): answer ``Hello`` with a heartbeat carrying
the journal's last ``seq`` and then replay every report after the daemon's ``last_seq``; send a
heartbeat every second to each known account; execute orders on the feed's clock even when the
feed is quiet (its last record's time, advanced by the wall clock since: an order sent after
the last record of a session is still acknowledged and executes against the last book, as the
daemon's own paper venue does); validate every frame (an invalid one is counted
and answered with nothing, since it has no order id to reject). The journal is kept in memory
for the life of the process: a restarted reference gateway starts a new journal, and the open
orders of the old process are gone (the daemon's ack timeout and order reconciliation cover it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from agent.errors import AgentError
from agent.execution.broker import PaperBroker
from agent.execution.config import BrokerConfig
from agent.execution.protocol import (
    CancelOrder,
    Heartbeat,
    Hello,
    NewOrder,
    ProtocolError,
    Report,
    decode_client,
    encode,
)
from feeds.sources.events import HealthEvent, RecordBatch

__all__ = ["GatewayServer"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Account:
    broker: PaperBroker
    journal: list[bytes] = field(default_factory=list)
    """Encoded reports; entry i has seq i + 1."""
    peer: bytes | None = None


class GatewayServer:
    """Serves the gateway protocol until :meth:`stop`; market data comes from :meth:`feed`."""

    def __init__(self, ctx: zmq.asyncio.Context, config: BrokerConfig, instrument_ids: list[int]) -> None:
        self._ctx = ctx
        self._config = config
        self._instrument_ids = instrument_ids
        self._accounts: dict[str, _Account] = {}
        self._peers: dict[bytes, str] = {}
        self._sock: zmq.asyncio.Socket | None = None
        self.invalid_frames = 0
        self.requests = 0
        """Orders and cancels received (valid ones, from a client that said Hello)."""
        self.records = 0
        self._feed_clock_ns = 0
        self._feed_wall_ns = 0

    def bind(self) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.linger = 0
        sock.router_mandatory = True
        try:
            sock.bind(self._config.gateway_endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise AgentError(
                f"gateway endpoint {self._config.gateway_endpoint} cannot be bound: {exc}"
            ) from None
        self._sock = sock
        log.info("gateway listening on %s", self._config.gateway_endpoint)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def serve(self) -> None:
        """Answer clients and send heartbeats until cancelled."""
        assert self._sock is not None, "bind() first"
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._heartbeats(), name="gateway-heartbeats"),
            loop.create_task(self._clock(), name="gateway-clock"),
        ]
        try:
            while True:
                frames = await self._sock.recv_multipart()
                if len(frames) != 2:
                    self.invalid_frames += 1
                    continue
                self._on_frame(frames[0], frames[1])
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def feed(self, events: AsyncIterator[RecordBatch | HealthEvent]) -> None:
        """Drive every account's book from a source until it ends."""
        async for event in events:
            if isinstance(event, RecordBatch):
                self.records += len(event)
                if len(event):
                    self._feed_clock_ns = max(self._feed_clock_ns, int(event.records["ts_recv"][-1]))
                    self._feed_wall_ns = time.time_ns()
                for account in self._accounts.values():
                    self._publish(account, account.broker.on_records(event.records))

    def _account(self, name: str) -> _Account:
        account = self._accounts.get(name)
        if account is None:
            account = _Account(broker=PaperBroker(self._config, self._instrument_ids))
            self._accounts[name] = account
        return account

    def _on_frame(self, peer: bytes, frame: bytes) -> None:
        try:
            message = decode_client(frame)
        except ProtocolError as exc:
            self.invalid_frames += 1
            log.warning("gateway: invalid frame from a client (%s)", exc)
            return
        if isinstance(message, Hello):
            self._hello(peer, message)
            return
        name = self._peers.get(peer)
        if name is None:
            self.invalid_frames += 1
            log.warning("gateway: %s before Hello; ignored", type(message).__name__)
            return
        account = self._accounts[name]
        self.requests += 1
        if isinstance(message, NewOrder):
            reports = account.broker.submit(message)
        else:
            assert isinstance(message, CancelOrder)
            reports = account.broker.cancel(message)
        self._publish(account, reports)

    def _hello(self, peer: bytes, hello: Hello) -> None:
        account = self._account(hello.account)
        if account.peer is not None and account.peer != peer:
            self._peers.pop(account.peer, None)
        account.peer = peer
        self._peers[peer] = hello.account
        self._send(account, encode(Heartbeat(seq=len(account.journal), ts_ns=time.time_ns())))
        replay = account.journal[max(hello.last_seq, 0) :]
        for frame in replay:
            self._send(account, frame)
        log.info("gateway: account %s connected (replayed %d reports)", hello.account, len(replay))

    def _publish(self, account: _Account, reports: list[Report]) -> None:
        for report in reports:
            frame = encode(report)
            account.journal.append(frame)
            self._send(account, frame)

    def _send(self, account: _Account, frame: bytes) -> None:
        if self._sock is None or account.peer is None:
            return
        try:
            self._sock.send_multipart([account.peer, frame], flags=zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError) as exc:
            # The peer is gone or slow: the report stays in the journal and is replayed on Hello.
            log.debug("gateway: report not delivered now (%s); kept in the journal", exc)

    async def _clock(self) -> None:
        """Execute what is due on the feed's clock while the feed is quiet (every 50 ms)."""
        while True:
            await asyncio.sleep(0.05)
            if not self._feed_clock_ns:
                continue
            now = self._feed_clock_ns + max(0, time.time_ns() - self._feed_wall_ns)
            for account in self._accounts.values():
                self._publish(account, account.broker.advance(now))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.time_ns()
            for account in self._accounts.values():
                self._send(account, encode(Heartbeat(seq=len(account.journal), ts_ns=now)))
