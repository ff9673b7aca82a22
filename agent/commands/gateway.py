"""``tradeagent gateway``: the reference execution gateway (the paper broker behind ZeroMQ).

It binds ``broker.gateway_endpoint`` and fills the orders of any daemon running with
``broker.mode = "gateway"`` against the market data of ``[feeds.source]`` (read with its own,
non-durable subscription, so it never steals a durable consumer's messages). Runs until
SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

import msgspec
import zmq.asyncio

from agent.config import Config, load_config
from agent.execution.gateway import GatewayServer
from feeds.sources import build_source

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("gateway", help="run the reference execution gateway (paper fills over ZeroMQ)")
    parser.add_argument("--endpoint", help="override broker.gateway_endpoint (bind address)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    broker = config.broker
    if args.endpoint:
        broker = msgspec.structs.replace(broker, gateway_endpoint=args.endpoint)
    source = msgspec.structs.replace(config.feeds.source, durable="")
    feeds = msgspec.structs.replace(config.feeds, source=source)
    config = msgspec.structs.replace(config, broker=broker, feeds=feeds)
    return asyncio.run(_serve(config))


async def _serve(config: Config) -> int:
    ctx = zmq.asyncio.Context()
    server = GatewayServer(ctx, config.broker, [s.instrument_id for s in config.feeds.instruments])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    source = build_source(config.feeds)
    try:
        server.bind()
        await source.start()
        tasks = [
            loop.create_task(server.serve(), name="gateway-serve"),
            loop.create_task(server.feed(source), name="gateway-feed"),
            loop.create_task(stop.wait(), name="gateway-stop"),
        ]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        with contextlib.suppress(Exception):
            await source.stop()
        server.close()
        ctx.destroy(linger=0)
    log.info(
        "gateway stopped (%d records seen, %d orders and cancels, %d invalid frames)",
        server.records,
        server.requests,
        server.invalid_frames,
    )
    return 0
