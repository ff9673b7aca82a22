"""The reference gateway and the daemon's gateway venue over real ZeroMQ sockets."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import numpy as np
import zmq
import zmq.asyncio

from agent.execution.config import BrokerConfig
from agent.execution.gateway import GatewayServer
from agent.execution.protocol import Ack, Cancelled, CancelOrder, Fill, NewOrder, Report, encode
from agent.execution.venues import GatewayVenue
from feeds.sources.events import RecordBatch
from tests.execution.books import px, record
from tests.support.wait import wait_until_async

ES = 1001
MS = 1_000_000


def _endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _book(ts: int) -> np.ndarray:
    return record(ES, ts, [(px(-1), 5)], [(px(1), 3), (px(2), 4)])


async def test_orders_fill_through_the_gateway_and_reports_replay_after_reconnect() -> None:
    ctx = zmq.asyncio.Context()
    config = BrokerConfig(mode="gateway", gateway_endpoint=_endpoint(), latency_ms=1.0, account="acct")
    server = GatewayServer(ctx, config, [ES])
    server.bind()
    serving = asyncio.create_task(server.serve())
    market: asyncio.Queue[np.ndarray] = asyncio.Queue()

    async def events() -> AsyncIterator[RecordBatch]:
        while True:
            yield RecordBatch(await market.get(), 0)

    feeding = asyncio.create_task(server.feed(events()))
    got: list[Report] = []
    venue = GatewayVenue(ctx, config, got.append)
    try:
        await venue.start()
        await wait_until_async(lambda: venue.healthy, 5, "the venue connected")
        await market.put(_book(0))
        venue.submit(NewOrder(client_order_id="s1-1", instrument_id=ES, side="buy", qty=5, ts_ns=MS))
        venue.submit(
            NewOrder(
                client_order_id="s1-2",
                instrument_id=ES,
                side="sell",
                qty=1,
                order_type="limit",
                limit_price=px(10),
                ts_ns=MS,
            )
        )
        await wait_until_async(lambda: server.requests == 2, 5, "both orders at the gateway")
        await market.put(_book(5 * MS))
        await wait_until_async(lambda: len(got) >= 3, 5, "2 acks and a fill")
        fills = [r for r in got if isinstance(r, Fill)]
        assert len(fills) == 1 and fills[0].qty == 5 and fills[0].price == px(1.4)
        assert {type(r) for r in got} == {Ack, Fill}

        # The daemon goes away; meanwhile the resting order is cancelled by a new connection of
        # the same account... then the first venue reconnects and gets what it missed.
        seen = venue.last_seq
        await venue.close()
        other: list[Report] = []
        venue2 = GatewayVenue(ctx, config, other.append, last_seq=seen)
        await venue2.start()
        await wait_until_async(lambda: venue2.healthy, 5, "the second venue connected")
        venue2.cancel(CancelOrder(client_order_id="s1-2", ts_ns=6 * MS))
        await wait_until_async(lambda: server.requests == 3, 5, "the cancel at the gateway")
        await market.put(_book(10 * MS))
        await wait_until_async(lambda: any(isinstance(r, Cancelled) for r in other), 5, "the cancel")
        await venue2.close()

        replayed: list[Report] = []
        venue3 = GatewayVenue(ctx, config, replayed.append, last_seq=seen)
        await venue3.start()
        await wait_until_async(
            lambda: any(isinstance(r, Cancelled) for r in replayed), 5, "the cancel replayed"
        )
        assert [r.seq for r in replayed] == [r.seq for r in other]
        await venue3.close()
    finally:
        feeding.cancel()
        serving.cancel()
        await asyncio.gather(feeding, serving, return_exceptions=True)
        server.close()
        ctx.destroy(linger=0)


async def test_invalid_frames_are_counted_and_never_crash_the_gateway() -> None:
    ctx = zmq.asyncio.Context()
    config = BrokerConfig(mode="gateway", gateway_endpoint=_endpoint())
    server = GatewayServer(ctx, config, [ES])
    server.bind()
    serving = asyncio.create_task(server.serve())
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(config.gateway_endpoint)
    try:
        await dealer.send(b"\xff\x00 not msgpack")
        await dealer.send(encode(NewOrder(client_order_id="x", instrument_id=ES, side="buy", qty=1, ts_ns=0)))
        await wait_until_async(lambda: server.invalid_frames == 2, 5, "2 invalid frames")
        assert not serving.done()
    finally:
        dealer.close(linger=0)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        server.close()
        ctx.destroy(linger=0)


async def test_an_order_after_the_last_record_executes_on_the_feed_clock() -> None:
    """A quiet feed (the end of a session) does not leave orders without an ack: the gateway
    advances its books on the last record's time plus the wall time since."""
    ctx = zmq.asyncio.Context()
    config = BrokerConfig(mode="gateway", gateway_endpoint=_endpoint(), latency_ms=20.0, account="acct")
    server = GatewayServer(ctx, config, [ES])
    server.bind()
    serving = asyncio.create_task(server.serve())
    now = time.time_ns()

    async def one_book() -> AsyncIterator[RecordBatch]:
        yield RecordBatch(_book(now), 0)

    got: list[Report] = []
    venue = GatewayVenue(ctx, config, got.append)
    try:
        await venue.start()
        await wait_until_async(lambda: venue.healthy, 5, "the venue connected")
        await server.feed(one_book())  # the feed ends after one record
        venue.submit(NewOrder(client_order_id="s1-1", instrument_id=ES, side="buy", qty=2, ts_ns=now))
        await wait_until_async(lambda: len(got) >= 2, 5, "an ack and a fill")
        assert isinstance(got[0], Ack) and got[0].ts_ns == now + 20 * MS
        assert isinstance(got[1], Fill) and got[1].qty == 2 and got[1].price == px(1)
    finally:
        await venue.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        server.close()
        ctx.destroy(linger=0)
