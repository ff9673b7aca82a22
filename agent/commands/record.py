"""``tradeagent record --out DIR``: write the NATS market-data stream into daily ``.dbn.zst``
files (durable JetStream consumer ``feeds.recorder.durable``).

The archive directory is checked writable before anything starts. Runs until SIGTERM or
SIGINT, then flushes, acknowledges and exits 0. A recorder killed with SIGKILL loses nothing
for good: completed files are intact, the open file is readable up to its last flush and the
rest is redelivered when it restarts (see :mod:`feeds.recorder`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from agent.commands.feed_job import report, run_feed_job
from agent.commands.outputs import output_dir
from agent.config import load_config
from feeds.recorder import Recorder

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("record", help="record the NATS market-data stream into daily .dbn.zst files")
    parser.add_argument(
        "--out", help="archive directory (default: feeds.recorder.out_dir or <data_dir>/recordings)"
    )
    parser.add_argument("--nats-url", help="NATS server (default: feeds.source.nats_url)")
    parser.add_argument("--json", action="store_true", help="print the final counters as one JSON object")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    feeds = config.feeds
    if args.nats_url:
        source = msgspec.structs.replace(feeds.source, nats_url=args.nats_url)
        feeds = msgspec.structs.replace(feeds, source=source)
    out = output_dir("--out", args.out or feeds.recorder.out_dir or Path(config.data_dir) / "recordings")
    recorder = Recorder(feeds, out)

    result = run_feed_job(recorder, f"record -> {out}", lambda c: f"{c.records_written:,} records written")
    report(result, as_json=args.json, line=f"recorded {result['records_written']:,} records into {out}")
    return 0
