"""What the daemon tests share: a short synthetic feed, a promoted model, a config file, a
daemon run in-process (:func:`running`) or as a real ``tradeagent run`` subprocess driven
through its control socket (:class:`DaemonProcess`), a ``tradeagent relay`` subprocess, and the
ledger read back to hold the daemon to what it counted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from sqlalchemy import select

from agent.bench.daemon import trading_checkpoint
from agent.config import Config, load_config
from agent.control.client import ControlClient
from agent.control.endpoints import control_endpoint
from agent.control.errors import ControlUnreachable
from agent.daemon.app import Daemon
from agent.daemon.events import Events
from agent.daemon.intake import DecisionQueue, Intake
from agent.daemon.lifecycle import State
from agent.daemon.metrics import DaemonMetrics
from agent.execution.fills import PositionArrays, apply_fills, to_currency
from agent.execution.protocol import Report
from agent.execution.venues import PaperVenue
from agent.model.config import ModelConfig
from agent.trading.risk import Halts
from feeds.config import InstrumentSpec, SynthConfig
from feeds.dbn import read_mbp10
from feeds.features import IncrementalFeatures
from feeds.sources import Source
from feeds.synth import write_synthetic
from storage import CheckpointStore, Ledger, ModelRegistry, open_database
from storage.tables import FillRow, OrderRow
from storage.values import instrument_set_key
from tests.support.wait import wait_until, wait_until_async

__all__ = [
    "INSTRUMENTS",
    "DaemonProcess",
    "assert_ledger_is",
    "by_symbol",
    "config_text",
    "daemon_config",
    "install_model",
    "ledger_ids",
    "ledger_state",
    "live_intake",
    "model_checkpoint",
    "nats_source",
    "quiet",
    "relay_done",
    "relaying",
    "replay_source",
    "resting_bid",
    "running",
    "synth_feed",
    "write_config",
]

# Five-minute sessions keep the feeds small (~1,800 records per instrument).
INSTRUMENTS = (
    InstrumentSpec(symbol="ES", instrument_id=1001, tick_size=0.25, tick_value=12.5, session_end="13:35"),
    InstrumentSpec(symbol="NQ", instrument_id=1002, tick_size=0.25, tick_value=5.0, session_end="13:35"),
)
TINY = ModelConfig(window=4, d_model=16, n_layers=1, headdim=8, d_state=8, n_atoms=21, return_bins=11)
_ACCOUNT = "paper"


def synth_feed(out: Path, *, seed: int = 7, days: int = 1) -> list[Path]:
    """Daily synthetic ``.dbn.zst`` files of :data:`INSTRUMENTS` (planted signal)."""
    return write_synthetic(out, instruments=INSTRUMENTS, synth=SynthConfig(days=days, signal=0.5), seed=seed)


def model_checkpoint(seed: int = 0, *, d_model: int = TINY.d_model) -> tuple[bytes, str]:
    """A tiny untrained network that trades, as checkpoint bytes, and its layout fingerprint."""
    return trading_checkpoint(msgspec.structs.replace(TINY, d_model=d_model), seed=seed)


def install_model(config: Config, blob: bytes, fingerprint: str, *, promote: bool = True) -> str:
    """Store, register and (by default) promote a checkpoint for the config's instruments."""
    database = open_database(config.storage, config.data_dir)
    try:
        sha = CheckpointStore.for_data_dir(config.data_dir).put(blob)
        registry = ModelRegistry(database)
        registry.register_candidate(
            sha256=sha,
            instrument_set=instrument_set_key([s.symbol for s in config.feeds.instruments]),
            layout_fingerprint=fingerprint,
            path=str(CheckpointStore.for_data_dir(config.data_dir).path(sha)),
            metrics={},
        )
        if promote:
            registry.promote(sha, by="test")
        return sha
    finally:
        database.close()


def config_text(data_dir: Path, source: str, *, extra: str = "", storage_url: str = "") -> str:
    """A daemon configuration: tiny model, paper broker, no metrics port, no schedule; the
    source's dataset is the synthetic feeds' (``SYNTH``) unless ``source`` sets one."""
    dataset = "" if "dataset" in source else f'dataset = "{SynthConfig().dataset}"\n'
    instruments = "".join(
        f"""
[[feeds.instruments]]
symbol = "{s.symbol}"
instrument_id = {s.instrument_id}
tick_size = {s.tick_size}
tick_value = {s.tick_value}
session_end = "{s.session_end}"
"""
        for s in INSTRUMENTS
    )
    storage = f'\n[storage]\nurl = "{storage_url}"\n' if storage_url else ""
    return f"""
data_dir = "{data_dir}"
device = "cpu"

[feeds.source]
{dataset}{source}

[model]
window = {TINY.window}
d_model = {TINY.d_model}
n_layers = {TINY.n_layers}
headdim = {TINY.headdim}
d_state = {TINY.d_state}
n_atoms = {TINY.n_atoms}
return_bins = {TINY.return_bins}

[policy]
max_contracts = 3

[daemon]
stop_timeout_s = 10.0
status_interval_s = 0.2
stale_decision_ms = 60000.0

[control]
metrics_port = 0

[schedule]
enabled = false
{storage}{extra}{instruments}"""


def write_config(path: Path, text: str) -> Config:
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={})


def replay_source(feed: Path, pace: float) -> str:
    """``[feeds.source]``: a replay of ``feed`` at ``pace`` x real time (0: as fast as it goes)."""
    return f'kind = "replay"\npath = "{feed}"\npace = {pace}'


def nats_source(url: str, *, durable: str = "daemon", symbols: Sequence[str] = ()) -> str:
    """``[feeds.source]``: the NATS feed at ``url`` (dataset ``SYNTH``) through the durable
    consumer ``durable``, filtered on ``symbols`` when given."""
    only = f"\nsymbols = {list(symbols)!r}".replace("'", '"') if symbols else ""
    return f'kind = "nats"\nnats_url = "{url}"\ndurable = "{durable}"{only}'


def daemon_config(where: Path, source: str, *, extra: str = "", storage_url: str = "") -> tuple[Path, Config]:
    """A configuration file ``where / "daemon.toml"`` for :func:`config_text` (the data directory
    ``where / "data"``) with a tiny model promoted: its path and the configuration."""
    path = where / "daemon.toml"
    config = write_config(path, config_text(where / "data", source, extra=extra, storage_url=storage_url))
    install_model(config, *model_checkpoint())
    return path, config


def resting_bid(feed: Path, instrument_id: int) -> int:
    """A limit price 40 ticks (of 0.25) under the lowest bid of ``instrument_id`` in ``feed``."""
    records = read_mbp10(feed)
    bids = records["bid_px_00"][records["instrument_id"] == instrument_id]
    return int(bids.min()) - 40 * 250_000_000


# ---------------------------------------------------------------- the daemon in-process


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[Daemon]:
    """A :class:`Daemon` on the test's loop, running; on the way out it stops and exits 0."""
    daemon = Daemon(config)
    task = asyncio.create_task(daemon.run())
    try:
        await wait_until_async(
            lambda: daemon.state is State.RUNNING or task.done(),
            60,
            lambda: f"the daemon to run ({daemon.state})",
        )
        if task.done():
            task.result()
        yield daemon
    finally:
        daemon.request_stop()
        assert await asyncio.wait_for(task, 60) == 0


def quiet(daemon: Daemon) -> bool:
    """No open order and no ledger write waiting: every report is committed and counted."""
    status = daemon.status()
    return status.open_orders == 0 and status.ledger_backlog["pending"] == 0


# ---------------------------------------------------------------- processes


class DaemonProcess:
    """``python -m agent.cli --config FILE run`` as a real subprocess (``module``: a module that
    runs the CLI in a prepared process instead, e.g. ``tests.support.sqlite_full``). ``env``
    (added to this process's environment) reaches the daemon and :attr:`config`, which is the
    configuration the daemon runs with (its control socket is where this one talks to it)."""

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        module: str = "agent.cli",
    ) -> None:
        self.config_path = config_path
        self.module = module
        self._env = {**os.environ, **(env or {})}
        self.config = load_config(config_path, env=self._env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = ControlClient(
            control_endpoint(self.config.control, self.config.data_dir), timeout_s=5.0
        )

    def start(self, timeout: float = 60.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "--config", str(self.config_path), "run"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        self.wait_until(lambda s: s["state"] == "running", timeout)

    def status(self) -> dict[str, Any]:
        return self.client.request("status")

    def wait_until(self, predicate: Callable[[dict[str, Any]], Any], timeout: float = 60.0) -> dict[str, Any]:
        """The daemon's status once ``predicate`` holds for it (it fails at once if the daemon
        exits)."""
        last: dict[str, Any] = {}

        def holds() -> dict[str, Any] | None:
            nonlocal last
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                last = self.status()
            except ControlUnreachable:
                return None
            return last if predicate(last) else None

        return wait_until(
            holds,
            timeout,
            lambda: f"the daemon's status to hold; last {last}\n{self.log_tail()}",
            interval=0.1,
        )

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finish(self) -> dict[str, Any]:
        """Stop with SIGTERM once trading has settled (:func:`_settled`), which must exit 0: the
        last status."""
        status = _settled(self)
        assert self.terminate() == 0, self.log_tail()
        return status

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "<no log>"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


def _settled(daemon: DaemonProcess, settle_s: float = 1.0, timeout_s: float = 60.0) -> dict[str, Any]:
    """The daemon's status once the feed is consumed and trading has settled: no order open
    and records, decisions, orders and fills unchanged for ``settle_s`` (the last bar closes'
    decisions and their fills land after the last record is read); fails after ``timeout_s``."""
    last: tuple[Any, ...] = ()
    since = time.monotonic()
    status: dict[str, Any] = {}

    def still() -> dict[str, Any] | None:
        nonlocal last, since, status
        status = daemon.status()
        counts = status["counts"]
        now = (status["feed"]["records"], counts.get("decisions"), counts.get("orders"), counts.get("fills"))
        if now != last or status["open_orders"]:
            last, since = now, time.monotonic()
            return None
        return status if time.monotonic() - since > settle_s else None

    return wait_until(
        still, timeout_s, lambda: f"the daemon to settle: {status}\n{daemon.log_tail()}", interval=0.1
    )


@contextmanager
def relaying(config_path: Path, feed: Path, pace: float) -> Iterator[subprocess.Popen[bytes]]:
    """``tradeagent relay`` of ``feed`` at ``pace`` x real time, logging to ``relay.log`` beside
    the configuration; killed on the way out unless it has exited."""
    with (config_path.parent / "relay.log").open("ab") as log:
        relay = subprocess.Popen(
            [
                *(sys.executable, "-m", "agent.cli", "--config", str(config_path), "relay"),
                *("--source", "replay", "--path", str(feed), "--pace", str(pace)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield relay
    finally:
        _stop_process(relay)


def relay_done(relay: subprocess.Popen[bytes], config_path: Path) -> None:
    """Wait for :func:`relaying`'s relay to publish everything and exit 0."""
    code = relay.wait(60)
    assert code == 0, (config_path.parent / "relay.log").read_text(errors="replace")[-3000:]


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` unless it has exited, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# ---------------------------------------------------------------- the ledger


def ledger_state(config: Config) -> tuple[dict[int, int], float, int, list[str]]:
    """Positions, realised P&L net of fees (currency) and fill count from the ledger, and the
    realised P&L recomputed offline from the recorded fills with the shared fill maths."""
    database = open_database(config.storage, config.data_dir)
    try:
        ledger = Ledger(database)
        fills = ledger.fills(account=_ACCOUNT)
        positions = ledger.positions(_ACCOUNT)
    finally:
        database.close()
    by_id = {s.instrument_id: s for s in INSTRUMENTS}
    stored = sum(
        to_currency(p.realized_points, by_id[i].tick_size, by_id[i].tick_value) - p.fees
        for i, p in positions.items()
    )
    offline = 0.0
    for iid, spec in by_id.items():
        mine = [f for f in fills if f.instrument_id == iid]
        book = PositionArrays.flat(1)
        for f in mine:
            qty = f.qty if f.side == "buy" else -f.qty
            book = apply_fills(book, np.array([float(qty)]), np.array([float(f.price)]))
        offline += float(to_currency(book.realised_px[0], spec.tick_size * 1e9, spec.tick_value))
        offline -= sum(f.fee for f in mine)
        assert positions.get(iid) is None or positions[iid].qty == int(book.position[0])
    assert stored == pytest.approx(offline, abs=1e-6)
    return {i: p.qty for i, p in positions.items()}, stored, len(fills), [f.fill_id for f in fills]


def ledger_ids(config: Config) -> tuple[list[str], list[str]]:
    """Every order's and every fill's id in the ledger, one per row."""
    database = open_database(config.storage, config.data_dir)
    try:
        return database.read(
            lambda s: (
                list(s.scalars(select(OrderRow.client_order_id))),
                list(s.scalars(select(FillRow.fill_id))),
            ),
            what="read the ids of the ledger's orders and fills",
        )
    finally:
        database.close()


def by_symbol(positions: dict[int, int]) -> dict[str, int]:
    """Positions by instrument id, as the daemon's status names them (every instrument)."""
    names = {s.instrument_id: s.symbol for s in INSTRUMENTS}
    return {names[i]: positions.get(i, 0) for i in names}


def assert_ledger_is(config: Config, status: dict[str, Any]) -> None:
    """The ledger holds exactly the orders and fills that ``status`` (of a daemon that
    stopped) counted, each once, and its positions and realised P&L."""
    counts = status["counts"]
    orders, fills = ledger_ids(config)
    assert len(orders) == len(set(orders)) == counts["orders"]
    assert len(fills) == len(set(fills)) == counts["fills"]
    positions, realised, _, _ = ledger_state(config)
    assert by_symbol(positions) == status["positions"]
    assert realised == pytest.approx(status["realised_pnl"], abs=0.01)


async def _no_settle() -> None:
    raise AssertionError("a live feed does not wait for the ledger")


def live_intake(
    config: Config,
    source: Source,
    features: IncrementalFeatures,
    *,
    queue: int,
    venue: PaperVenue | None = None,
    **clock: int,
) -> tuple[Intake, DecisionQueue, DaemonMetrics]:
    """The daemon's intake of a live feed on its own: ``source`` through the paper venue (a new
    one unless given) and ``features`` into a decision queue of ``queue`` closes (``clock``:
    ``bar_interval_ns``, ``close_grace_ns``, for bars that close on the clock)."""
    metrics = DaemonMetrics()
    decisions = DecisionQueue(queue, metrics)
    reports: list[Report] = []
    intake = Intake(
        source=source,
        features=features,
        venue=venue or PaperVenue(config.broker, [s.instrument_id for s in INSTRUMENTS], reports.append),
        queue=decisions,
        metrics=metrics,
        events=Events(Halts(), metrics),
        replay=False,
        venue_latency_ns=0,
        settle=_no_settle,
        **clock,
    )
    return intake, decisions, metrics
