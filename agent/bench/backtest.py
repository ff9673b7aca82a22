"""``tradeagent bench backtest``: records per second of both backtest drivers, and peak memory.

The benchmark file is the one ``tradeagent bench feed`` uses (``--records`` synthetic MBP-10
records of the configured instruments, cached under ``<data_dir>/bench/``). The model is a
freshly initialised checkpoint of the configured ``[model]`` (the speed does not depend on the
weights) served on the configured device, with the configured policy, bars and broker.

``event_records_per_s``
    the event-driven driver (:mod:`agent.backtest.event`): replay source, incremental
    book/health/bars/features, one engine decision per bar close, risk, paper broker and the SQL
    ledger (throwaway SQLite), timed from the first record to the last.
``fast_records_per_s``
    the vectorised driver (:mod:`agent.backtest.fast`): read and decode the file, vectorised
    features, regime path and ``--chunks`` spans per instrument decided in lockstep. Neither
    driver's time includes building its engine (device start, kernel compilation).
``peak_rss_mb``
    the process's peak resident memory while the two drivers ran (MiB; Linux resets the peak
    after the benchmark file is prepared, elsewhere the whole process's peak).

Where each driver's time goes, from its engine's calls timed from outside
(:class:`~agent.bench.probes.EngineCalls`):

``event_decide_us``, ``event_host_us``
    the median engine call (one bar close a call) and the driver's own time a decision (its
    elapsed time less every engine call, over its decisions: features, trading step, risk,
    broker, ledger);
``fast_load_s``, ``fast_steps_s``, ``fast_engine_s``
    the vectorised run's read and features (with the regime path), its lockstep steps' own work,
    and its engine calls (``fast_decide_us`` the median one, ``fast_rows_per_call`` their rows);
``event_device_us``, ``fast_device_us``
    the median device time of the engine calls (a CUDA engine's own timer, read on every
    :data:`DEVICE_EVERY`-th call; ``null`` on the CPU): a call's wall time beyond it is the
    host's and the launch's.

Also reported: ``records``, ``bars``, ``event_records`` (the event driver may be timed on the
first ``--event-records`` records only, a rate being a rate) and the decisions each made.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from agent.backtest.event import EventDriver
from agent.backtest.fast import load_bars, regime_path, run_fast
from agent.backtest.runs import run_decider, scratch_ledger
from agent.bench.feed import feed_file, write_records
from agent.bench.probes import EngineCalls
from agent.config import Config
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes, checkpoint_to_bytes
from agent.model.params import init_params
from agent.policy.observation import AGENT_FEATURES
from agent.policy.regime import RegimeTracker
from feeds.dbn import iter_mbp10
from feeds.dbn.framing import concat_mbp10
from feeds.features import FEATURE_NAMES

__all__ = ["add_arguments", "run"]

CHUNKS = 64
DEVICE_EVERY = 8
"""A CUDA engine's device time is read on every this-many-th call (:class:`EngineCalls`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the benchmark file")
    parser.add_argument(
        "--event-records",
        type=int,
        metavar="N",
        help="time the event driver on the first N records (default: all)",
    )
    parser.add_argument("--chunks", type=int, default=CHUNKS, help="vectorised driver: spans per instrument")
    parser.add_argument("--seed", type=int, default=0, help="synthetic generator seed")


def _checkpoint(config: Config) -> Checkpoint:
    names = (*FEATURE_NAMES, *AGENT_FEATURES)
    cfg = config.model.with_features(len(names))
    blob = checkpoint_to_bytes(
        init_params(cfg, np.random.default_rng(0)),
        cfg,
        feature_names=names,
        norm_mean=np.zeros(len(names), np.float32),
        norm_std=np.ones(len(names), np.float32),
    )
    return checkpoint_from_bytes(blob)


def _fast(path: Path, config: Config, checkpoint: Checkpoint, chunks: int) -> dict[str, Any]:
    specs = list(config.feeds.instruments)
    start = time.perf_counter()
    bars = load_bars(
        path,
        specs,
        config.feeds,
        start_ns=0,
        end_ns=2**62,
        latency_ms=config.broker.latency_ms,
        close_grace_ns=config.daemon.close_grace_ns,
    )
    frames = [bars.frames[s.symbol] for s in specs]
    regimes = regime_path(frames, RegimeTracker(config.regime, config.policy.scale_floor, [0.0] * len(specs)))
    load_s = time.perf_counter() - start
    # Built where `tradeagent backtest --fast` builds it (after the bars, so the peak memory is
    # the command's), and, as in _event, its start (device, kernel compilation) not timed.
    decider = run_decider(checkpoint, config, specs, chunks)
    calls = EngineCalls(DEVICE_EVERY)
    try:
        with calls.installed():
            start = time.perf_counter()
            log = run_fast(bars, specs, config, decider, regimes, chunks=chunks).log
            run_s = time.perf_counter() - start
    finally:
        decider.close()
    engine_s = calls.wall_s()
    return {
        "fast_records_per_s": bars.n_records / (load_s + run_s),
        "bars": sum(len(f) for f in frames),
        "fast_decisions": int(log.arrays()["ts_ns"].size),
        "fast_load_s": round(load_s, 3),
        "fast_steps_s": round(run_s - engine_s, 3),
        "fast_engine_s": round(engine_s, 3),
        "fast_rows_per_call": round(calls.rows_per_call(), 1),
        "fast_decide_us": calls.median_wall_us(),
        "fast_device_us": calls.median_device_us(),
    }


def _event(path: Path, config: Config, checkpoint: Checkpoint) -> dict[str, Any]:
    specs = list(config.feeds.instruments)
    decider = run_decider(checkpoint, config, specs)
    calls = EngineCalls(DEVICE_EVERY)
    try:
        with scratch_ledger("tradeagent-bench-") as database, calls.installed():
            driver = EventDriver(config, specs, decider, database, [0.0] * len(specs))
            start = time.perf_counter()
            run = asyncio.run(driver.replay(path, 0, 2**62))
            elapsed = time.perf_counter() - start
    finally:
        decider.close()
    decisions = int(run.log.arrays()["ts_ns"].size)
    return {
        "event_records": run.records,
        "event_records_per_s": run.records / elapsed,
        "event_decisions": decisions,
        "event_host_us": round((elapsed - calls.wall_s()) / max(decisions, 1) * 1e6, 2),
        "event_decide_us": calls.median_wall_us(),
        "event_device_us": calls.median_device_us(),
    }


def run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    console = Console(stderr=True)
    checkpoint = _checkpoint(config)
    with Progress(console=console, transient=True) as progress:
        path = feed_file(config, args.records, args.seed, progress)
        with tempfile.TemporaryDirectory(prefix="tradeagent-bench-") as tmp:
            event_path = path
            if args.event_records and args.event_records < args.records:
                event_path = _prefix(path, Path(tmp) / "prefix.dbn", args.event_records, config)
            reset = _reset_peak_rss()  # the drivers' peak, not the file preparation's
            task = progress.add_task("vectorised driver", total=None)
            fast = _fast(path, config, checkpoint, max(1, args.chunks))
            progress.update(task, description="event-driven driver")
            event = _event(event_path, config, checkpoint)
            peak_mb = _peak_rss_mb(reset)
    return {"records": args.records, **event, **fast, "peak_rss_mb": peak_mb}


def _prefix(path: Path, out: Path, records: int, config: Config) -> Path:
    """The first ``records`` records of ``path`` as a plain DBN file (read in chunks)."""
    parts, have = [], 0
    for chunk in iter_mbp10(path, chunk_records=1 << 16):
        parts.append(chunk[: records - have].copy())
        have += len(parts[-1])
        if have >= records:
            break
    return write_records(out, concat_mbp10(parts), config)


def _reset_peak_rss() -> bool:
    """Reset the process's peak resident set (Linux: ``/proc/self/clear_refs``); False where
    that is not possible (the peak then counts the whole process)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_mb(reset: bool) -> float:
    """Peak resident memory in MiB since :func:`_reset_peak_rss` (``VmHWM``), else the process's."""
    if reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
