"""A live feed's time bars close on the clock, a grace after their boundary, without waiting for
the status tick: in a busy feed by any instrument's record stamped that late, on a feed quiet
altogether by the feed task's timer. Bars closed by an instrument's own records are unchanged,
and no bar closes ahead of records already received. A bar closed on the clock is stamped with
that moment (its orders are placed then), and the paper book's clock moves there first."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.config import Config
from agent.daemon.intake import DecisionQueue, Intake
from agent.daemon.metrics import DaemonMetrics
from agent.execution.orders import OrderManager
from agent.execution.protocol import Fill, Report
from agent.execution.venues import PaperVenue
from feeds.dbn import read_mbp10
from feeds.features import BarFrame, IncrementalFeatures
from feeds.sources import QueuedSource
from tests.daemon.support import INSTRUMENTS, config_text, live_intake, synth_feed, write_config
from tests.support.wait import wait_until_async

ES, NQ = (s.instrument_id for s in INSTRUMENTS)
INTERVAL_NS = 1_000_000_000
GRACE_NS = 50_000_000


class _Held(QueuedSource):
    """A live source that delivers ``batches`` at its start and then stays open, sending nothing."""

    def __init__(self, batches: list[np.ndarray]) -> None:
        super().__init__("held", max_batches=100_000, stale_after_s=600.0)
        self._batches = batches

    async def _start(self) -> None:
        for batch in self._batches:
            self._emit_records(batch)

    async def _stop(self) -> None:
        self._finish()


def _intake(
    config: Config, batches: list[np.ndarray], venue: PaperVenue | None = None
) -> tuple[Intake, DecisionQueue, DaemonMetrics]:
    features = IncrementalFeatures(config.feeds.instruments, config.feeds.bars, config.feeds.health)
    return live_intake(
        config,
        _Held(batches),
        features,
        queue=100_000,
        venue=venue,
        bar_interval_ns=INTERVAL_NS,
        close_grace_ns=GRACE_NS,
    )


def _bars(queue: DecisionQueue, iid: int) -> BarFrame:
    return BarFrame.concat([c.frame for c in queue if c.frame.instrument_id == iid])


def _last_close(queue: DecisionQueue, iid: int) -> int:
    """The latest bar close of ``iid`` queued so far (-1: none)."""
    return max((int(c.frame.ts_close[-1]) for c in queue if c.frame.instrument_id == iid), default=-1)


def _setup(tmp_path: Path) -> tuple[Config, np.ndarray]:
    synth_feed(tmp_path / "synth")
    config = write_config(
        tmp_path / "daemon.toml",
        config_text(tmp_path / "data", 'kind = "nats"\nnats_url = "nats://127.0.0.1:1"\ndataset = "SYNTH"'),
    )
    return config, read_mbp10(tmp_path / "synth")


def _reference(config: Config, batches: list[np.ndarray]) -> dict[int, BarFrame]:
    """The bars the instruments' own records close, pushed one batch at a time."""
    features = IncrementalFeatures(config.feeds.instruments, config.feeds.bars, config.feeds.health)
    frames = [f for batch in batches for f in features.push_records(batch)]
    return {iid: BarFrame.concat([f for f in frames if f.instrument_id == iid]) for iid in (ES, NQ)}


async def test_a_quiet_instrument_closes_by_the_feed_clock_of_the_others(tmp_path: Path) -> None:
    config, records = _setup(tmp_path)
    ts = records["ts_recv"].astype(np.int64)
    cut = int(ts[0]) + 40 * INTERVAL_NS  # NQ says nothing after this; ES goes on for 3 s
    end = cut + 3 * INTERVAL_NS
    keep = (ts <= end) & ((records["instrument_id"] == ES) | (ts <= cut))
    batches = np.array_split(records[keep], int(keep.sum()) // 2)

    intake, queue, metrics = _intake(config, batches)
    await intake.start()
    last_es = int(ts[keep][-1])
    due = (last_es - GRACE_NS - 1) // INTERVAL_NS * INTERVAL_NS  # the last boundary the grace passed
    await wait_until_async(lambda: _last_close(queue, NQ) >= due, 30, "NQ's bars closed by the clock")
    await intake.stop()

    mine = {iid: _bars(queue, iid) for iid in (ES, NQ)}
    theirs = _reference(config, batches)
    # NQ's own records closed the same bars; past its last record the clock closed the rest, up
    # to the last boundary the feed clock passed by the grace.
    n = len(theirs[NQ])
    for name in ("ts_close", "features", "n_records", "tradable"):
        np.testing.assert_array_equal(getattr(mine[NQ], name)[:n], getattr(theirs[NQ], name))
    extra = mine[NQ].ts_close[n:]
    assert extra.size >= 3 and (extra > int(ts[keep & (records["instrument_id"] == NQ)][-1])).all()
    assert due in extra.tolist()
    assert metrics.counts()["clock_closes"] >= 1
    # ES's bars, closed by its own records up to the end, are the reference's; its last open
    # bar (ES stamped a record inside it) closes only once the clock passes its boundary too.
    m = len(theirs[ES])
    for name in ("ts_close", "features", "n_records", "tradable"):
        np.testing.assert_array_equal(getattr(mine[ES], name)[:m], getattr(theirs[ES], name))


async def test_a_feed_quiet_altogether_closes_its_open_bars_after_the_grace(tmp_path: Path) -> None:
    config, records = _setup(tmp_path)
    ts = records["ts_recv"].astype(np.int64)
    first = records[ts <= int(ts[0]) + 20 * INTERVAL_NS]
    batches = np.array_split(first, len(first) // 3)
    stamps = first["ts_recv"].astype(np.int64)
    last = {iid: int(stamps[first["instrument_id"] == iid].max()) for iid in (ES, NQ)}
    open_close = {iid: -(-t // INTERVAL_NS) * INTERVAL_NS for iid, t in last.items()}
    # an NQ order placed at NQ's last record: no NQ record follows its arrival, so only the
    # clock can execute it, against NQ's last book
    reports: list[Report] = []
    venue = PaperVenue(config.broker, [ES, NQ], reports.append)
    venue.submit(OrderManager("t").new(NQ, "buy", 1, ts_ns=last[NQ]))

    intake, queue, metrics = _intake(config, batches, venue)
    await intake.start()
    # Nothing arrives after the first 20 s: without the status tick (none runs here), only the
    # feed task's timer can close each instrument's open bar, at its boundary plus the grace.
    for iid in (ES, NQ):
        await wait_until_async(
            lambda iid=iid: _last_close(queue, iid) >= open_close[iid],
            30,
            f"the open bar of {iid} closed",
        )
    assert intake.clock_ns == max(last.values())  # no record came; the feed clock is extrapolated
    await intake.stop()
    # the closes stamp the moment the clock closed them, which the orders take
    for iid in (ES, NQ):
        close = next(c for c in queue if c.frame.instrument_id == iid and open_close[iid] in c.frame.ts_close)
        assert close.at_ns > open_close[iid] + GRACE_NS
        assert intake.order_ns(close) == close.at_ns > intake.clock_ns
    # the clock close moved the paper book's clock: the NQ order filled at NQ's last ask
    fills = [r for r in reports if isinstance(r, Fill)]
    nq_last = first[first["instrument_id"] == NQ][-1]
    assert [(f.instrument_id, f.qty, f.price) for f in fills] == [(NQ, 1, int(nq_last["ask_px_00"]))]
    theirs = _reference(config, batches)
    for iid in (ES, NQ):
        mine = _bars(queue, iid)
        n = len(theirs[iid])
        np.testing.assert_array_equal(mine.ts_close[:n], theirs[iid].ts_close)
        assert open_close[iid] in mine.ts_close[n:].tolist()
        at = mine.ts_close.tolist().index(open_close[iid])
        assert mine.n_records[at] > 0  # the bar that holds the instrument's last records
    assert metrics.counts()["clock_closes"] >= 2
