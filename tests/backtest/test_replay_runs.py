"""The replay walk through a batch (:meth:`IncrementalFeatures.closing_runs`: the batch pushed as
one array; the daemon's replay and the event-driven backtest) hands out the same runs, bars,
decision times and books as pushing the records one at a time, closing the time bars due on the
clock before each record (:func:`closing_runs` here, the reference)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.dbn.framing import mbp10_header_ok
from feeds.features import BarFrame, IncrementalFeatures
from feeds.records import MBP10_DTYPE, UNDEF_PRICE
from tests.feeds.recbuild import random_book

SPECS = [InstrumentSpec(symbol="ES", instrument_id=1001), InstrumentSpec(symbol="NQ", instrument_id=1002)]
HEALTH = HealthConfig(stale_after_s=2.0, max_price_jump_ticks=50)


def closing_runs(
    features: IncrementalFeatures, records: np.ndarray, grace_ns: int
) -> Iterator[tuple[np.ndarray, tuple[BarFrame, ...], int, bool]]:
    """Reference: ``records`` pushed one at a time. Before each record, the time bars its clock
    makes due (decided ``grace_ns`` + 1 ns after their close, the feed clock being the latest
    ``ts_recv`` of the configured instruments' MBP-10 records) are decided in time order, those
    of one moment together (in the instruments' order), after the records before it; then the
    bars the record closes, at its clock. Each decision with the records since the last one;
    then the records left (no frame)."""
    size = MBP10_DTYPE.itemsize
    raw = np.ascontiguousarray(records).data.cast("B")
    builders = list(features.by_id.values())
    ok = mbp10_header_ok(np.ascontiguousarray(records)) & np.isin(
        records["instrument_id"], list(features.by_id)
    )
    start = 0
    for k in range(records.shape[0]):
        clock = max(b.clock_ns for b in builders)
        if ok[k]:
            clock = max(clock, int(records["ts_recv"][k]))
        due: list[tuple[int, int, BarFrame]] = []
        for i, builder in enumerate(builders):
            builder.close_on_clock(clock - grace_ns)
            frame = builder.take_frame()
            for j in range(0 if frame is None else len(frame)):
                assert frame is not None
                due.append((int(frame.ts_close[j]) + grace_ns + 1, i, _bar(frame, j)))
        for decided, together in itertools.groupby(sorted(due, key=lambda d: d[:2]), key=lambda d: d[0]):
            yield records[start:k], tuple(bar for _, _, bar in together), decided, True
            start = k
        frame = features.push(raw[k * size : (k + 1) * size])
        if frame is not None:
            yield records[start : k + 1], (frame,), features.by_id[frame.instrument_id].clock_ns, False
            start = k + 1
    if start < records.shape[0]:
        yield records[start:], (), max(b.clock_ns for b in builders), False


def _bar(frame: BarFrame, j: int) -> BarFrame:
    """Bar ``j`` of ``frame`` as a frame of its own."""
    return dataclasses.replace(
        frame,
        **{
            f.name: getattr(frame, f.name)[j : j + 1]
            for f in dataclasses.fields(frame)
            if f.name not in ("instrument_id", "symbol")
        },
    )


def feed(seed: int) -> np.ndarray:
    """Two interleaved instruments with faults (crossed books, an empty side, time and sequence
    regressions, silences past the stale interval), an unknown instrument and a record whose
    header is not MBP-10's."""
    rng = np.random.default_rng(seed)
    es = random_book(4000, seed=seed, mean_gap_ns=20_000_000)
    nq = random_book(3000, seed=seed + 1, instrument_id=1002, mean_gap_ns=25_000_000)
    for book in (es, nq):
        n = len(book)
        book["bid_px_00"][rng.random(n) < 0.003] = book["ask_px_00"][0]
        gone = rng.random(n) < 0.003
        book["ask_px_00"][gone], book["ask_sz_00"][gone] = UNDEF_PRICE, 0
        book["ts_recv"][rng.random(n) < 0.002] -= 10**9
        book["sequence"][rng.random(n) < 0.002] = 0
        book["ts_recv"] += np.cumsum(np.where(rng.random(n) < 0.001, 3 * 10**9, 0)).astype(np.uint64)
    records = np.concatenate([es, nq, random_book(20, seed=seed + 2, instrument_id=9)])
    records = records[np.argsort(records["ts_recv"], kind="stable")]
    records["rtype"][len(records) // 2] = 0x0B
    return records


def snapshot(
    features: IncrementalFeatures, run: np.ndarray, frames: tuple[BarFrame, ...], decided: int, on_clock: bool
) -> tuple[Any, ...]:
    """What a caller sees when it takes a run: the records, the bars, their time and every book."""
    books = []
    for builder in features.by_id.values():
        book = builder.book()
        books.append(None if book is None else dataclasses.astuple(book))
    bars = []
    for frame in frames:
        fields = {f.name: getattr(frame, f.name) for f in dataclasses.fields(frame)}
        bars.append({k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in fields.items()})
    return run.tobytes(), bars, decided, on_clock, str(books)


@pytest.mark.parametrize(
    "bars",
    [
        BarConfig(clock="time", interval_s=0.5),
        BarConfig(clock="time", interval_s=0.05),
        BarConfig(clock="events", events=7),
        BarConfig(clock="events", events=1),
    ],
    ids=["time-0.5", "time-0.05", "events-7", "events-1"],
)
@pytest.mark.parametrize("grace_ms", [0.0, 10.0, 5_000.0])
def test_batch_walk_hands_out_what_the_record_walk_does(bars: BarConfig, grace_ms: float) -> None:
    grace_ns = round(grace_ms * 1e6)
    records = feed(seed=5)
    sizes = np.random.default_rng(6).choice([1, 2, 9, 60, 500, 3000], size=len(records))
    cuts = np.cumsum(sizes)
    batches = np.split(records, cuts[cuts < len(records)])
    by_record = IncrementalFeatures(SPECS, bars, HEALTH)
    by_batch = IncrementalFeatures(SPECS, bars, HEALTH)
    decided = on_clock = together = 0
    for k, batch in enumerate(batches):
        if k == len(batches) // 3:  # a transport gap between batches, as the driver reports one
            for features in (by_record, by_batch):
                for builder in features.by_id.values():
                    builder.report_gap(int(batch["ts_recv"][0]))
        expected = [snapshot(by_record, *run) for run in closing_runs(by_record, batch, grace_ns)]
        got = [snapshot(by_batch, *run) for run in by_batch.closing_runs(batch, grace_ns=grace_ns)]
        assert got == expected
        decided += sum(bool(bars) for _, bars, _, _, _ in got)
        on_clock += sum(clock for _, _, _, clock, _ in got)
        together += sum(len(bars) > 1 for _, bars, _, _, _ in got)
    assert decided > 100
    if bars.clock == "events" or grace_ms > 1_000:
        assert on_clock == together == 0
    else:  # this feed has quiet stretches: bars closed on the clock (runs without a record), at
        # times both instruments' at one moment (one run)
        assert on_clock > 10 and together > 10
    assert by_batch.rejected == by_record.rejected == 21
    assert [b.book() for b in by_batch.by_id.values()] == [b.book() for b in by_record.by_id.values()]


def test_a_walk_left_early_shows_the_last_book_again() -> None:
    records = feed(seed=8)[:3000]
    features = IncrementalFeatures(SPECS, BarConfig(clock="time", interval_s=0.5), HEALTH)
    walk = features.closing_runs(records, grace_ns=50_000_000)
    run, frames, _, _ = next(walk)
    assert frames
    es = features.by_id[1001].book()
    assert es is not None and es.ts_recv == int(run["ts_recv"][run["instrument_id"] == 1001][-1])
    walk.close()
    last = records[records["instrument_id"] == 1001][-1]
    es = features.by_id[1001].book()
    assert es is not None and es.ts_recv == int(last["ts_recv"])
