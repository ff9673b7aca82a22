"""``tradeagent record --out DIR``: write the NATS market-data stream into daily ``.dbn.zst``
files (durable JetStream consumer ``feeds.recorder.durable``).

The archive directory is checked writable before anything starts. Runs until SIGTERM or
SIGINT, then flushes, acknowledges and exits 0. A recorder killed with SIGKILL loses nothing
for good: completed files are intact, the open file is readable up to its last flush and the
rest is redelivered when it restarts (see :mod:`feeds.recorder`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from agent.commands.outputs import output_dir
from agent.commands.relay import progress_display, run_until_signalled
from agent.config import load_config
from feeds.recorder import Recorder, RecorderCounters

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

    async def main(stop: asyncio.Event) -> dict[str, Any]:
        with progress_display() as progress:
            task = progress.add_task(f"record -> {out}", status="")

            def show(counters: RecorderCounters) -> None:
                progress.update(task, status=f"{counters.records_written:,} records written")

            counters = await recorder.run(stop, show)
        return {**counters.snapshot(), "source": recorder.source.counters.snapshot()}

    result = run_until_signalled(main)
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print(f"recorded {result['records_written']:,} records into {out}", file=sys.stderr)
    return 0
