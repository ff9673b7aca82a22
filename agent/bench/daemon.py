"""``tradeagent bench daemon``: end-to-end latency of the trading daemon through NATS.

Set-up (everything real, in a temporary directory): a private ``nats-server``; a synthetic
MBP-10 feed of ``--instruments`` instruments (default 10) at about ``--rate`` records/s in
total (default 10,000), cut to ``--seconds`` of market time; ``tradeagent relay`` publishes it
at real-time pace as a subprocess; the daemon runs in this process (on ``--device``, default the
CPU) with the paper broker, the embedded SQLite ledger, the configured model shape (a freshly
initialised network whose return head is tilted so that it trades) and ``--bar`` second time
bars (default 0.25 s, so that the K-bar windows fill and many decisions are measured in a short
run).

Keys:

``p50_ms``, ``p99_ms``
    From the arrival of the record that closes a bar (the wall-clock time the NATS batch holding
    it was taken from the transport, see ``agent.daemon.intake.closing_arrivals``; before
    2026-11-30 a run of batches counted from its first batch) to the order leaving the daemon
    (handed to the paper broker, after the batched decision and the risk checks; the order's
    ledger row is committed right behind it, see :mod:`agent.daemon.placement`). Bars closed by
    the clock on a quiet feed are measured from that clock tick.
``decision_p50_ms``, ``decision_p99_ms``
    The same start to the decision taken (the batched decision done), for every bar that may
    trade (``decision`` telemetry messages, ``decision_samples`` of them): the path every order
    takes before the risk checks, measured on ~60x as many bars as there are orders.
``records_per_s``
    Records the daemon consumed per second of wall time over the run.

Where the time goes: ``decide_p50_ms``/``decide_p99_ms`` (one batched ``InferenceEngine.decide``;
``decide_rows`` its mean rows, ``decide_device_us`` its median device time on a CUDA engine, else
``null``) and ``ledger_p50_ms``/``ledger_p99_ms`` (from an order's placing to its row's commit, queue wait
included: what an order would wait if it were committed before leaving, as orders bound for a
gateway are). Also: ``orders``, ``decisions``, ``bars_dropped`` (stale or overflowing
decisions), ``instruments``, ``seconds``, ``device``.

How it measures, from outside the daemon's code: each order's latency is the ``latency_ns`` of
its ``order`` message on the daemon's telemetry socket (to which the benchmark subscribes, as
any operator's tool may); the decisions and the ledger commits are timed by wrapping two public
calls for the run (:class:`_Probes`: ``InferenceEngine.decide`` and ``Ledger.record_orders``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from agent.bench.probes import EngineCalls
from agent.config import Config
from agent.control.endpoints import telemetry_endpoint
from agent.daemon.app import Daemon
from agent.daemon.lifecycle import State
from agent.errors import AgentError
from agent.model.checkpoint import checkpoint_to_bytes
from agent.model.config import ModelConfig
from agent.model.params import init_params, layout_fingerprint, param_shapes
from agent.policy.observation import AGENT_FEATURES
from feeds.config import InstrumentSpec, SynthConfig
from feeds.dbn import read_mbp10, write_mbp10
from feeds.features import FEATURE_NAMES
from feeds.natsd import NatsServer, NatsServerUnavailable
from feeds.synth import write_synthetic
from storage import CheckpointStore, Ledger, ModelRegistry, open_database
from storage.values import LedgerOrder, instrument_set_key

__all__ = ["add_arguments", "run", "trading_checkpoint"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instruments", type=int, default=10, help="instruments traded (default 10)")
    parser.add_argument("--rate", type=float, default=10_000.0, help="total records/s (default 10,000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="market seconds to replay (default 30)")
    parser.add_argument("--bar", type=float, default=0.25, help="bar interval in seconds (default 0.25)")
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="cpu", help="inference device (default cpu)"
    )


def trading_checkpoint(model: ModelConfig, *, seed: int = 0, edge: float = 3.0) -> tuple[bytes, str]:
    """A freshly initialised network for the live feature layout, as checkpoint bytes plus its
    layout fingerprint. The return head's top bin gets ``edge`` extra logit so the Kelly sizing
    sees an edge whenever Thompson picks "long": such a model trades (long or flat), which is
    what benchmarks and tests of the order path need. It has learned nothing."""
    cfg = model.with_features(len(FEATURE_NAMES) + len(AGENT_FEATURES))
    params = init_params(cfg, np.random.default_rng(seed))
    params["ret.b"] = params["ret.b"].copy()
    params["ret.b"][-1] += edge
    n = cfg.n_features
    blob = checkpoint_to_bytes(
        params,
        cfg,
        feature_names=(*FEATURE_NAMES, *AGENT_FEATURES),
        norm_mean=np.zeros(n, np.float32),
        norm_std=np.ones(n, np.float32),
        metadata={"purpose": "untrained network that trades, for benchmarks and tests", "seed": seed},
    )
    return blob, layout_fingerprint(param_shapes(cfg))


def _instruments(n: int) -> tuple[InstrumentSpec, ...]:
    return tuple(
        InstrumentSpec(symbol=f"I{k:02d}", instrument_id=2000 + k, session_start="13:30", session_end="13:32")
        for k in range(n)
    )


def _feed(out: Path, specs: tuple[InstrumentSpec, ...], rate: float, seconds: float) -> tuple[Path, int]:
    synth = SynthConfig(days=1, events_per_second=rate / len(specs), dataset="BENCH")
    (day,) = write_synthetic(out / "raw", instruments=specs, synth=synth, seed=1)
    records = read_mbp10(day)
    ts = records["ts_recv"].astype(np.int64)
    keep = records[ts < ts[0] + int(seconds * 1e9)]
    path = write_mbp10(
        out / "bench.dbn",
        keep,
        dataset="BENCH",
        symbols={s.instrument_id: s.symbol for s in specs},
        start_ns=int(ts[0]),
        end_ns=int(keep["ts_recv"][-1]) + 1,
    )
    return path, int(keep.shape[0])


def run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    specs = _instruments(args.instruments)
    with tempfile.TemporaryDirectory(prefix="tradeagent-bench-daemon-") as tmp:
        root = Path(tmp)
        feed, total = _feed(root, specs, args.rate, args.seconds)
        try:
            nats = NatsServer(store_dir=root / "nats")
            nats.start()
        except NatsServerUnavailable as exc:
            raise AgentError(f"bench daemon needs nats-server: {exc}") from None
        try:
            bench_config = _bench_config(config, root, specs, nats.url, args.bar, device=args.device)
            blob, fingerprint = trading_checkpoint(bench_config.model)
            _install(bench_config, blob, fingerprint)
            return asyncio.run(_measure(bench_config, root, feed, total))
        finally:
            nats.close()


def _bench_config(
    config: Config, root: Path, specs: tuple[InstrumentSpec, ...], url: str, bar_s: float, *, device: str
) -> Config:
    feeds = msgspec.structs.replace(
        config.feeds,
        instruments=specs,
        bars=msgspec.structs.replace(config.feeds.bars, clock="time", interval_s=bar_s),
        source=msgspec.structs.replace(
            config.feeds.source, kind="nats", nats_url=url, dataset="BENCH", symbols=(), durable="bench"
        ),
    )
    return msgspec.structs.replace(
        config,
        data_dir=str(root / "data"),
        device=device,
        feeds=feeds,
        storage=msgspec.structs.replace(config.storage, url=""),
        control=msgspec.structs.replace(config.control, endpoint="", telemetry_endpoint="", metrics_port=0),
        schedule=msgspec.structs.replace(config.schedule, enabled=False),
        broker=msgspec.structs.replace(config.broker, mode="paper"),
        daemon=msgspec.structs.replace(config.daemon, mode="paper", checkpoint=""),
        policy=msgspec.structs.replace(config.policy, max_contracts=max(config.policy.max_contracts, 3)),
        risk=msgspec.structs.replace(config.risk, max_orders_per_minute=1_000_000),
    )


def _install(config: Config, blob: bytes, fingerprint: str) -> None:
    database = open_database(config.storage, config.data_dir)
    try:
        store = CheckpointStore.for_data_dir(config.data_dir)
        sha = store.put(blob)
        registry = ModelRegistry(database)
        registry.register_candidate(
            sha256=sha,
            instrument_set=instrument_set_key([s.symbol for s in config.feeds.instruments]),
            layout_fingerprint=fingerprint,
            path=str(store.path(sha)),
            metrics={},
        )
        registry.promote(sha, by="bench daemon")
    finally:
        database.close()


async def _measure(config: Config, root: Path, feed: Path, total: int) -> dict[str, Any]:
    relay_config = root / "relay.toml"
    relay_config.write_text(
        f'[feeds.source]\nnats_url = "{config.feeds.source.nats_url}"\ndataset = "BENCH"\n', encoding="utf-8"
    )
    probes = _Probes()
    sent: list[dict[str, Any]] = []
    decided: list[dict[str, Any]] = []
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(b"order")
    sub.subscribe(b"decision")
    try:
        with probes.installed():
            daemon = Daemon(config)
            task = asyncio.get_running_loop().create_task(daemon.run())
            try:
                while daemon.state is not State.RUNNING:
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.05)
                sub.connect(telemetry_endpoint(config.control, config.data_dir))
                reader = asyncio.get_running_loop().create_task(_read_telemetry(sub, sent, decided))
                elapsed, consumed = await _relay(daemon, relay_config, feed, total, root / "relay.log")
                counts = daemon.counts
                deadline = time.monotonic() + 10  # every order's telemetry message reached us
                while len(sent) < counts["orders"] and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                reader.cancel()
                engine = daemon.engine
                device = engine.backend.description if engine is not None else config.device
            finally:
                daemon.request_stop()
                await task
    finally:
        sub.close(linger=0)
        ctx.destroy(linger=0)
    latencies = np.array([o["latency_ns"] for o in sent], dtype=np.float64) / 1e6
    if latencies.size == 0:
        raise AgentError("the daemon sent no order during the benchmark; no latency to report")
    decisions = np.array([d["latency_ns"] for d in decided], dtype=np.float64) / 1e6
    decide = np.array(probes.decide.wall_ns, dtype=np.float64) / 1e6
    committed = probes.committed_ns
    waits = [
        committed[o["client_order_id"]] - o["sent_ns"] for o in sent if o["client_order_id"] in committed
    ]
    ledger = np.array(waits, dtype=np.float64) / 1e6
    return {
        "p50_ms": _pct(latencies, 50),
        "p99_ms": _pct(latencies, 99),
        "decision_p50_ms": _pct(decisions, 50),
        "decision_p99_ms": _pct(decisions, 99),
        "decision_samples": int(decisions.size),
        "records_per_s": round(consumed / elapsed, 1) if elapsed > 0 else None,
        "decide_p50_ms": _pct(decide, 50),
        "decide_p99_ms": _pct(decide, 99),
        "decide_calls": int(decide.size),
        "decide_rows": round(probes.decide.rows_per_call(), 2),
        "decide_device_us": probes.decide.median_device_us(),
        "feed_runs": counts["feed_runs"],
        "ledger_p50_ms": _pct(ledger, 50),
        "ledger_p99_ms": _pct(ledger, 99),
        "orders": int(latencies.size),
        "decisions": counts["decisions"],
        "bars_dropped": counts["dropped_decisions"] + counts["stale_decisions"],
        "instruments": len(config.feeds.instruments),
        "seconds": round(elapsed, 2),
        "device": device,
    }


async def _relay(
    daemon: Daemon, relay_config: Path, feed: Path, total: int, log_path: Path
) -> tuple[float, int]:
    """Relay ``feed`` at real-time pace to the running daemon: the seconds from its first
    record to the last (or to the deadline), and the records it consumed."""
    log = log_path.open("wb")
    relay = subprocess.Popen(
        [
            *(sys.executable, "-m", "agent.cli", "--config", str(relay_config), "relay"),
            *("--source", "replay", "--path", str(feed), "--pace", "1"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    first: float | None = None
    deadline = time.monotonic() + 120 + total / 1000
    while (records := daemon.records) < total and time.monotonic() < deadline:
        if first is None and records:
            first = time.monotonic()
        if relay.poll() not in (None, 0):
            break
        await asyncio.sleep(0.01)
    elapsed = time.monotonic() - (first or time.monotonic())
    await asyncio.sleep(0.5)  # the last bars' decisions and orders
    consumed = daemon.records
    if await asyncio.to_thread(relay.wait, 60) != 0:
        raise AgentError(f"relay failed: {log_path.read_text(errors='replace')[-2000:]}")
    return elapsed, consumed


async def _read_telemetry(
    sub: zmq.asyncio.Socket, orders: list[dict[str, Any]], decisions: list[dict[str, Any]]
) -> None:
    """Every ``order`` (its latency, when it left) and ``decision`` message of the telemetry."""
    while True:
        topic, body = await sub.recv_multipart()
        (orders if topic == b"order" else decisions).append(msgspec.json.decode(body))


class _Probes:
    """Two public calls of the daemon's process, wrapped for the run: each
    ``InferenceEngine.decide`` (one batched decision: :class:`~agent.bench.probes.EngineCalls`,
    its device time read on every call), and when each order's ledger row was committed
    (``Ledger.record_orders``, on the daemon's SQL thread)."""

    def __init__(self) -> None:
        self.decide = EngineCalls()
        self.committed_ns: dict[str, int] = {}
        """client order id -> wall clock (UNIX ns) when its row's transaction returned."""

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        record_orders = Ledger.record_orders

        def stamped_record_orders(
            ledger: Ledger, rows: Sequence[LedgerOrder], *args: Any, **kwargs: Any
        ) -> Any:
            result = record_orders(ledger, rows, *args, **kwargs)
            now = time.time_ns()
            for row in rows:
                self.committed_ns[row.client_order_id] = now
            return result

        Ledger.record_orders = stamped_record_orders  # type: ignore[method-assign,assignment]
        try:
            with self.decide.installed():
                yield
        finally:
            Ledger.record_orders = record_orders  # type: ignore[method-assign]


def _pct(values: np.ndarray[Any, np.dtype[np.float64]], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values.size else None
