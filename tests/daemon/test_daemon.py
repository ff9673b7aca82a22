"""Must-hold behaviour of the daemon, run in-process on the test's event loop with real
sockets, a real nats-server, the real SQLite ledger and real ZeroMQ control/telemetry:

* corrupt bytes on the NATS subject, a crossed book and a stale feed are counted, no order is
  sent on the instrument concerned, and the daemon keeps running;
* the database unavailable for a while: new orders halt, nothing acknowledged is lost, trading
  resumes when it returns;
* a promotion during trading swaps the model between two decisions; a corrupt or mismatched
  checkpoint is refused and the running model kept;
* a failure inside inference stops new orders and keeps all state; the CPU fallback happens
  only when configured, and is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np
import pytest
import zmq
import zmq.asyncio

from agent.config import Config
from agent.control.client import ControlClient
from agent.control.endpoints import control_endpoint, telemetry_endpoint
from agent.control.errors import ControlRefused
from agent.daemon.intake import INTAKE_BATCHES
from agent.daemon.lifecycle import State
from agent.gpu.errors import InferenceError
from feeds.dbn import read_mbp10, write_mbp10
from feeds.features import BarFrame, IncrementalFeatures
from feeds.sources import HealthEvent, HealthKind, QueuedSource, RecordBatch, SourceEvent, subject_for
from storage import CheckpointStore, Journal, Ledger, open_database
from storage.values import OrderRecord
from tests.daemon.support import (
    INSTRUMENTS,
    config_text,
    daemon_config,
    install_model,
    live_intake,
    model_checkpoint,
    nats_source,
    quiet,
    relay_done,
    relaying,
    replay_source,
    resting_bid,
    running,
    synth_feed,
    write_config,
)
from tests.support.nats_server import NatsServer
from tests.support.wait import observed, wait_until_async

ES, NQ = (s.instrument_id for s in INSTRUMENTS)


async def no_change(read: Callable[[], Any], seconds: float) -> Any:
    """What ``read()`` gives, after checking that it stays the same for ``seconds`` (an
    observation window: something that must not happen, does not)."""
    first, *later = await observed(read, seconds)
    assert all(value == first for value in later), (first, later)
    return first


def _setup(tmp_path: Path, source: str, extra: str = "") -> Config:
    return daemon_config(tmp_path, source, extra=extra)[1]


def _orders(config: Config) -> list[OrderRecord]:
    database = open_database(config.storage, config.data_dir)
    try:
        ledger = Ledger(database)
        open_ids = {o.client_order_id for o in ledger.open_orders("paper")}
        fills = ledger.fills(account="paper")
        ids = {f.client_order_id for f in fills} | open_ids
        return [ledger.order(i) for i in sorted(ids)]
    finally:
        database.close()


def _count_fills(config: Config) -> int:
    database = open_database(config.storage, config.data_dir)
    try:
        return Ledger(database).count_fills("paper")
    finally:
        database.close()


async def test_corrupt_bytes_crossed_book_and_stale_feed_block_only_that_instrument(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    feed_dir = tmp_path / "synth"
    synth_feed(feed_dir)
    records = read_mbp10(feed_dir)
    ts = records["ts_recv"].astype("int64")
    lo, hi = int(ts[0] + (ts[-1] - ts[0]) * 0.3), int(ts[0] + (ts[-1] - ts[0]) * 0.6)
    crossed = (records["instrument_id"] == ES) & (ts >= lo) & (ts < hi)
    records["bid_px_00"][crossed] = records["ask_px_00"][crossed] + 250_000_000  # bid above ask
    feed = write_mbp10(
        tmp_path / "faulty.dbn.zst",
        records,
        dataset="SYNTH",
        symbols={s.instrument_id: s.symbol for s in INSTRUMENTS},
        start_ns=int(ts[0]),
        end_ns=int(ts[-1]) + 1,
    )
    source = nats_source(nats_server.url, durable="d")
    config_path, config = daemon_config(tmp_path, source, extra="\n[feeds.health]\nstale_after_s = 4.0\n")
    async with running(config) as daemon:
        with relaying(config_path, feed, pace=40.0) as relay:
            client = await nats.connect(nats_server.url)
            try:
                await wait_until_async(lambda: daemon.counts["decisions"] > 20, 30, "20 decisions")
                for junk in (b"\x00garbage that is not DBN", b"\xff" * 368, b""):
                    await client.publish(subject_for("SYNTH", "ES"), junk)
                await client.flush()
            finally:
                await client.close()
            await asyncio.to_thread(relay_done, relay, config_path)
        await wait_until_async(lambda: daemon.counts["rejected_messages"] >= 2, 30, "the junk rejected")
        # The feed ends: within stale_after_s of feed time both books go stale.
        await wait_until_async(lambda: not any(daemon.status().healthy.values()), 20, "both books unhealthy")
        await wait_until_async(lambda: daemon.counts["feed_stale"] >= 1, 20, "a stale feed")
        await no_change(lambda: daemon.counts["orders"], 1.0)
        assert daemon.state is State.RUNNING
    orders = _orders(config)
    during = [o for o in orders if lo <= o.ts_created_ns < hi]
    assert [o for o in during if o.instrument_id == ES] == []
    assert any(o.instrument_id == NQ for o in during)  # the healthy instrument kept trading
    assert any(o.instrument_id == ES and o.ts_created_ns >= hi for o in orders)  # ES trades again


async def test_database_outage_halts_new_orders_and_loses_nothing(tmp_path: Path) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    extra = "\n[storage]\nbusy_timeout_ms = 100\nretry_deadline_s = 0.3\n"
    config = _setup(tmp_path, replay_source(feed, pace=30.0), extra=extra)
    async with running(config) as daemon:
        await wait_until_async(lambda: daemon.counts["fills"] >= 3, 30, "3 fills")
        lock = sqlite3.connect(Path(config.data_dir) / "tradeagent.db", timeout=5.0)
        lock.execute("BEGIN EXCLUSIVE")
        try:
            await wait_until_async(lambda: "database" in daemon.halts, 30, "a database halt")
            orders = await no_change(lambda: daemon.counts["orders"], 1.0)  # no new order while halted
        finally:
            lock.rollback()
            lock.close()
        await wait_until_async(lambda: "database" not in daemon.halts, 30, "the database halt cleared")
        await wait_until_async(lambda: daemon.counts["orders"] > orders, 30, "a new order")
        await wait_until_async(lambda: quiet(daemon), 30, "no open order or pending write")
    # Counted after the stop (trading goes on until then; the stop persists what is queued).
    assert _count_fills(config) == daemon.counts["fills"]
    # Paper orders leave before their rows are committed: those sent while the database was
    # locked waited in the write queue, and every order sent is in the ledger.
    with contextlib.closing(sqlite3.connect(Path(config.data_dir) / "tradeagent.db")) as db:
        assert db.execute("SELECT count(*) FROM orders").fetchone()[0] == daemon.counts["orders"]


async def test_promotion_swaps_between_decisions_and_bad_checkpoints_are_refused(tmp_path: Path) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    config = _setup(tmp_path, replay_source(feed, pace=20.0))
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(b"decision")
    seen: list[str] = []

    async def listen() -> None:
        while True:
            _, body = await sub.recv_multipart()
            seen.append(msgspec.json.decode(body)["model"])

    client = ControlClient(control_endpoint(config.control, config.data_dir), timeout_s=10.0)
    try:
        async with running(config) as daemon:
            first = daemon.status().model
            sub.connect(telemetry_endpoint(config.control, config.data_dir))
            listener = asyncio.create_task(listen())
            await wait_until_async(lambda: len(seen) >= 5, 30, "5 decisions published")
            blob, fingerprint = model_checkpoint(seed=1)
            second = install_model(config, blob, fingerprint, promote=False)
            reply = await asyncio.to_thread(client.request, "promote", sha256=second)
            assert reply == {"serving": second, "previous": first, "swapped": True}
            n_swap = len(seen)
            await wait_until_async(lambda: len(seen) >= n_swap + 5, 30, "5 decisions after the swap")
            await _promotions_refused(config, client)
            assert daemon.status().model == second
            n_after = len(seen)
            await wait_until_async(lambda: len(seen) >= n_after + 3, 30, "3 decisions after the refusals")
            listener.cancel()
    finally:
        sub.close(linger=0)
        ctx.destroy(linger=0)
    # Decisions used the first model, then the second, never a mix inside one and never back.
    switches = [i for i in range(1, len(seen)) if seen[i] != seen[i - 1]]
    assert seen[0] == first and seen[-1] == second and len(switches) == 1
    database = open_database(config.storage, config.data_dir)
    try:
        kinds = [e.kind for e in Journal(database).events()]
    finally:
        database.close()
    assert "swap" in kinds and kinds.count("swap_refused") == 2


async def _promotions_refused(config: Config, client: ControlClient) -> None:
    """A corrupt checkpoint and one of another layout are promoted: both are refused."""
    # Corrupt bytes in the store: the hash check refuses it.
    blob, fingerprint = model_checkpoint(seed=2)
    corrupt = install_model(config, blob, fingerprint, promote=False)
    path = CheckpointStore.for_data_dir(config.data_dir).path(corrupt)
    path.chmod(0o644)
    path.write_bytes(blob[:-10] + b"corrupted!")
    # Another layout (window 8 instead of 4 still fits; d_model does not).
    other = install_model(config, *model_checkpoint(seed=3, d_model=8), promote=False)
    for sha in (corrupt, other):
        with pytest.raises(ControlRefused, match="still serving"):
            await asyncio.to_thread(client.request, "promote", sha256=sha)


@pytest.mark.parametrize("fallback", [False, True])
async def test_inference_failure_halts_new_orders_and_keeps_state(
    tmp_path: Path, fallback: bool, caplog: pytest.LogCaptureFixture
) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    config = _setup(tmp_path, replay_source(feed, pace=20.0))
    config = msgspec.structs.replace(
        config, daemon=msgspec.structs.replace(config.daemon, cpu_fallback=fallback)
    )
    caplog.set_level(logging.WARNING, logger="agent.daemon")
    async with running(config) as daemon:
        await wait_until_async(lambda: daemon.counts["fills"] >= 2, 30, "2 fills")
        engine = daemon.engine
        assert engine is not None

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise InferenceError("injected: device lost")

        engine.decide = broken  # type: ignore[method-assign]
        await wait_until_async(lambda: daemon.counts["inference_failures"] >= 1, 30, "an inference failure")
        if fallback:  # the failure is counted first; the CPU engine is built on a worker thread
            await wait_until_async(lambda: daemon.engine is not engine, 30, "the CPU engine")
        await wait_until_async(lambda: quiet(daemon), 30, "no open order or pending write")
        positions = daemon.positions
        orders = daemon.counts["orders"]
        if fallback:
            assert "inference" not in daemon.halts
            await wait_until_async(lambda: daemon.counts["orders"] > orders, 30, "a new order")
            assert any("fell back to the CPU" in r.getMessage() for r in caplog.records)
        else:
            assert "inference" in daemon.halts
            assert await no_change(lambda: (daemon.counts["orders"], daemon.positions), 1.0) == (
                orders,
                positions,
            )
            assert daemon.state is State.RUNNING
            assert not any("fell back" in r.getMessage() for r in caplog.records)
    assert _count_fills(config) == daemon.counts["fills"]


async def test_flatten_and_a_persisted_operator_halt(tmp_path: Path) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    config = _setup(tmp_path, replay_source(feed, pace=20.0))
    client = ControlClient(control_endpoint(config.control, config.data_dir), timeout_s=10.0)
    async with running(config) as daemon:
        await wait_until_async(lambda: any(daemon.positions.values()), 30, "a position")
        reply = await asyncio.to_thread(client.request, "flatten")
        assert reply["flattening"] is True
        await wait_until_async(
            lambda: not any(daemon.positions.values()) and not daemon.status().flattening, 30, "flat"
        )
        await no_change(lambda: daemon.counts["orders"], 1.0)
        assert "operator" in daemon.halts
        database = open_database(config.storage, config.data_dir)
        try:  # the halt event is journaled (in the background)
            journal = Journal(database)
            await wait_until_async(
                lambda: any(e.details.get("kind") == "operator" for e in journal.events(kind="halt")),
                10,
                "the operator halt journaled",
            )
        finally:
            database.close()
    # The operator halt survives a restart until `ctl resume`.
    async with running(config) as daemon:
        assert "operator" in daemon.halts
        reply = await asyncio.to_thread(client.request, "resume")
        assert reply["cleared"] == ["operator"] and reply["halts"] == {}


async def test_nightly_retrain_promotion_is_swapped_in_and_a_failed_one_changes_nothing(
    tmp_path: Path,
) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    config = _setup(tmp_path, replay_source(feed, pace=20.0))
    retrain, outcome = tmp_path / "retrain.py", tmp_path / "outcome"
    retrain.write_text(
        "import pathlib, sys\n"
        "from agent.config import load_config\n"
        "from tests.daemon.support import install_model, model_checkpoint\n"
        "if pathlib.Path(sys.argv[1]).read_text() == 'fail':\n"
        "    sys.exit('gates failed')\n"
        f"config = load_config({str(tmp_path / 'daemon.toml')!r}, env={{}})\n"
        "install_model(config, *model_checkpoint(seed=5))\n",
        encoding="utf-8",
    )
    command = (sys.executable, str(retrain), str(outcome))
    config = msgspec.structs.replace(
        config, schedule=msgspec.structs.replace(config.schedule, command=command)
    )
    async with running(config) as daemon:
        serving = daemon.status().model
        outcome.write_text("fail")
        assert (await daemon.retrain()).outcome == "failed"
        assert daemon.status().model == serving and not daemon.halts  # nothing to reload
        outcome.write_text("promote")
        assert (await daemon.retrain()).outcome == "ok"
        await wait_until_async(lambda: daemon.status().model != serving, 30, "the retrained model served")
        assert daemon.counts["retrain_ok"] == 1 and daemon.counts["retrain_failed"] == 1


async def test_orderly_stop_cancels_a_resting_order(tmp_path: Path) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    config = _setup(tmp_path, replay_source(feed, pace=0.0))
    async with running(config) as daemon:
        await wait_until_async(
            lambda: daemon.status().feed["records"] > 1000 and quiet(daemon), 30, "1000 records, quiet"
        )
        # A bid 40 ticks under the lowest of the day: it rests (or is still on its way), and
        # nothing but the orderly stop closes it.
        order = daemon.send_order(ES, "buy", 1, limit_price=resting_bid(feed, ES))
        await wait_until_async(
            lambda: daemon.status().ledger_backlog["pending"] == 0, 10, "the order in the ledger"
        )  # in the ledger
    database = open_database(config.storage, config.data_dir)
    try:
        record = Ledger(database).order(order.client_order_id)
    finally:
        database.close()
    assert (record.status, record.filled_qty) == ("cancelled", 0)


class _Counted(IncrementalFeatures):
    """The features, counting the calls that push records through them."""

    pushes = 0

    def push_records(self, records: np.ndarray) -> list[BarFrame]:
        self.pushes += 1
        return super().push_records(records)


class _Queued(QueuedSource):
    """A source whose events are all queued before the daemon reads them (a backlog)."""

    def __init__(self, events: list[SourceEvent]) -> None:
        super().__init__("queued", max_batches=100_000, stale_after_s=60.0)
        self._events = events

    async def _start(self) -> None:
        for event in self._events:
            if isinstance(event, HealthEvent):
                self._emit_health(event)
            else:
                self._emit_records(event.records)
        self._finish()

    async def _stop(self) -> None:
        return None


async def test_live_feed_in_coalesced_runs_closes_the_same_bars_with_health_events_in_place(
    tmp_path: Path,
) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)
    records = read_mbp10(feed)[:3000]
    source = 'kind = "nats"\nnats_url = "nats://127.0.0.1:1"\ndataset = "SYNTH"'
    config = write_config(tmp_path / "daemon.toml", config_text(tmp_path / "data", source))
    # 20 s bars: a few batches close one (a run ends with such a batch), the others coalesce.
    bars = msgspec.structs.replace(config.feeds.bars, interval_s=20.0)
    config = msgspec.structs.replace(
        config,
        daemon=msgspec.structs.replace(config.daemon, decision_queue=100_000),
        feeds=msgspec.structs.replace(config.feeds, bars=bars),
    )
    # NATS-sized batches of 1-3 records, with a gap reported after the 500th batch.
    cuts = np.cumsum(np.resize([1, 2, 3], len(records)))
    chunks = np.split(records, cuts[cuts < len(records)])
    gap = HealthEvent(HealthKind.GAP, int(chunks[500]["ts_recv"][-1]), "test gap")
    events: list[SourceEvent] = [RecordBatch(c, 0) for c in chunks[:501]]
    events += [gap, *(RecordBatch(c, 0) for c in chunks[501:])]

    features = _Counted(config.feeds.instruments, config.feeds.bars, config.feeds.health)
    size = config.daemon.decision_queue
    intake, queue, metrics = live_intake(config, _Queued(events), features, queue=size)
    await intake.start()
    await intake.fed()
    await intake.stop()

    # The same records pushed one batch at a time, the gap reported at the same place.
    reference = IncrementalFeatures(config.feeds.instruments, config.feeds.bars, config.feeds.health)
    expected: list[BarFrame] = []
    closing = 0  # batches that close a bar
    for k, chunk in enumerate(chunks):
        frames = reference.push_records(chunk)
        expected += frames
        closing += bool(frames)
        if k == 500:
            for builder in reference.by_id.values():
                builder.report_gap(gap.at_ns)
    got = [c.frame for c in queue]
    # Runs of many batches, not one push per batch; a run ends with a batch that closes a bar
    # (its bars wait for no later batch), before a health event, or after INTAKE_BATCHES.
    assert features.pushes <= closing + 1 + -(-len(chunks) // INTAKE_BATCHES)
    assert features.pushes < len(chunks) // 10
    assert metrics.counts()["feed_gap"] == 1 and metrics.counts()["feed_runs"] == features.pushes
    for iid in (s.instrument_id for s in INSTRUMENTS):
        mine = BarFrame.concat([f for f in got if f.instrument_id == iid])
        theirs = BarFrame.concat([f for f in expected if f.instrument_id == iid])
        assert len(theirs) > 5 and not theirs.tradable.all()  # the gap made a bar not tradable
        for name in ("ts_close", "features", "close_index", "n_records", "tradable"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name))
