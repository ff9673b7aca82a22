"""``tradeagent relay``: publish a source (replay of DBN files or Databento Live) onto NATS.

Records go to ``md.mbp10.<dataset>.<symbol>`` (README "NATS subject layout"); the JetStream
stream ``feeds.source.stream`` is created if missing. A restarted relay resumes after the
stream's last message of each subject (records already there are skipped). A replay relay ends
when the files are published; a live relay runs until SIGTERM or SIGINT, then waits for the
acknowledgements still in flight and exits 0 within ``feeds.relay.stop_timeout_s`` (what is still
unacknowledged then is abandoned and logged). Progress goes to stderr; with ``--json`` the final
counters are printed on stdout as one JSON object.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from agent.commands.feed_job import report, run_feed_job
from agent.config import Config, load_config
from agent.errors import CommandError
from feeds.relay import Relay
from feeds.sources import build_source, config_symbols

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("relay", help="publish a replay or Databento Live source onto NATS")
    parser.add_argument(
        "--source",
        choices=("replay", "databento"),
        help="source kind (default: feeds.source.kind, which must then be replay or databento)",
    )
    parser.add_argument("--path", help="replay: a DBN file or a directory of daily files")
    parser.add_argument("--pace", type=float, help="replay: 0 = as fast as possible, N = real time x N")
    parser.add_argument("--nats-url", help="NATS server (default: feeds.source.nats_url)")
    parser.add_argument("--json", action="store_true", help="print the final counters as one JSON object")
    parser.set_defaults(func=_run)


def _configure(args: argparse.Namespace) -> Config:
    config = load_config(args.config)
    source = config.feeds.source
    changes: dict[str, Any] = {}
    if args.source:
        changes["kind"] = args.source
    if args.path is not None:
        changes["path"] = args.path
    if args.pace is not None:
        changes["pace"] = args.pace
    if args.nats_url:
        changes["nats_url"] = args.nats_url
    source = msgspec.structs.replace(source, **changes)
    return msgspec.structs.replace(config, feeds=msgspec.structs.replace(config.feeds, source=source))


def _run(args: argparse.Namespace) -> int:
    config = _configure(args)
    feeds = config.feeds
    if feeds.source.kind == "nats":
        raise CommandError("relay publishes to NATS: choose --source replay or --source databento")
    relay = Relay(
        build_source(feeds, restrict=False),
        url=feeds.source.nats_url,
        stream=feeds.source.stream,
        dataset=feeds.source.dataset,
        symbols=config_symbols(feeds),
        config=feeds.relay,
    )

    result = run_feed_job(
        relay,
        f"relay {relay.source.name}",
        lambda c: f"{c.records:,} records, {c.messages:,} messages",
    )
    report(
        result,
        as_json=args.json,
        line=(
            f"relayed {result['records']:,} records in {result['messages']:,} messages "
            f"({result['skipped_records']:,} already in the stream, {result['unknown_records']:,} "
            f"without a symbol, {result['retries']:,} retries)"
        ),
    )
    return 0
