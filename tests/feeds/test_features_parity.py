"""The vectorised and the incremental path give the same bars, bit for bit, and the same health."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt

import numpy as np
import pytest

from feeds.config import BarConfig, HealthConfig, InstrumentSpec, SynthConfig
from feeds.dbn import read_mbp10, write_mbp10
from feeds.features import (
    BarFrame,
    FeatureSet,
    FeatureStream,
    IncrementalBars,
    IncrementalFeatures,
    compute_all,
    compute_bars,
    compute_file,
)
from feeds.health import HealthMonitor
from feeds.records import UNDEF_PRICE
from feeds.synth import simulate_session
from tests.conftest import DBN_SAMPLES
from tests.feeds.recbuild import random_book

SPEC = InstrumentSpec(symbol="ES", instrument_id=1001)
HEALTH = HealthConfig(stale_after_s=2.0, max_price_jump_ticks=50)
# (clock, records): the incremental path runs the kernel once per bar, so short bars get fewer records
CLOCKS = [
    (BarConfig(clock="time", interval_s=1.0), 30_000),
    (BarConfig(clock="time", interval_s=0.1), 5_000),
    (BarConfig(clock="events", events=1), 1_500),
    (BarConfig(clock="events", events=37), 20_000),
]


def faulty_book(n: int, seed: int) -> np.ndarray:
    """A random book with every kind of fault and silences longer than the stale interval."""
    rng = np.random.default_rng(seed)
    records = random_book(n, seed=seed, mean_gap_ns=20_000_000)
    pick = lambda p: rng.random(n) < p  # noqa: E731
    records["bid_px_00"][pick(0.003)] = records["ask_px_00"][0]  # crossed / jumps
    gone = pick(0.003)
    records["ask_px_00"][gone], records["ask_sz_00"][gone] = UNDEF_PRICE, 0
    records["ts_recv"][pick(0.002)] -= 10**9  # back in time
    records["sequence"][pick(0.002)] = 0  # sequence regressions
    silence = np.cumsum(np.where(pick(0.001), 3 * 10**9, 0))
    records["ts_recv"] += silence.astype(np.uint64)
    return records


def assert_same(vectorised: BarFrame, incremental: list[BarFrame]) -> None:
    assert incremental, "the incremental path closed no bar"
    joined = BarFrame.concat(incremental)
    for field in dataclasses.fields(BarFrame):
        a, b = getattr(vectorised, field.name), getattr(joined, field.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype, field.name
            np.testing.assert_array_equal(a, b, err_msg=field.name, strict=True)
        else:
            assert a == b, field.name
    assert np.isfinite(vectorised.features).all()


def episodes(monitor: HealthMonitor) -> list[tuple[str, int, int | None, int]]:
    return sorted((str(e.check), e.start_ns, e.end_ns, e.count) for e in monitor.episodes)


@pytest.mark.parametrize(
    ("bars", "n"), CLOCKS, ids=[f"{c.clock}-{c.interval_s}-{c.events}" for c, _ in CLOCKS]
)
def test_parity_on_a_faulty_random_book(bars: BarConfig, n: int) -> None:
    records = faulty_book(n, seed=7)
    monitor = HealthMonitor(SPEC.instrument_id, SPEC.symbol)
    vectorised = compute_bars(records, SPEC, bars, HEALTH, monitor)
    incremental = IncrementalBars(SPEC, bars, HEALTH)
    assert_same(vectorised, incremental.push_records(records))
    assert not vectorised.tradable.all() and vectorised.tradable.any()
    assert episodes(monitor) == episodes(incremental.monitor)
    assert monitor.counters == incremental.monitor.counters


@pytest.mark.parametrize(
    "bars",
    [BarConfig(clock="time", interval_s=0.1), BarConfig(clock="events", events=7)],
    ids=["time", "events"],
)
def test_parity_record_by_record(bars: BarConfig) -> None:
    """push() judges each record with the scalar form of the rules (push_records with the array
    form) and finalises the bars each record closes on their own."""
    records = faulty_book(3000, seed=11)
    monitor = HealthMonitor(SPEC.instrument_id, SPEC.symbol)
    vectorised = compute_bars(records, SPEC, bars, HEALTH, monitor)
    incremental = IncrementalBars(SPEC, bars, HEALTH)
    closed = [incremental.push(record.tobytes()) for record in records]
    assert_same(vectorised, [frame for frame in closed if frame is not None])
    assert episodes(monitor) == episodes(incremental.monitor)
    assert monitor.counters == incremental.monitor.counters


@pytest.mark.parametrize("path", sorted(DBN_SAMPLES.glob("test_data.mbp-10*.dbn*")), ids=lambda p: p.name)
def test_parity_on_the_official_samples(path) -> None:
    records = read_mbp10(path)
    spec = InstrumentSpec(symbol="ESH1", instrument_id=int(records["instrument_id"][0]))
    for bars in (BarConfig(clock="events", events=1), BarConfig(clock="time", interval_s=1e-6)):
        vectorised = compute_bars(records, spec, bars, HealthConfig())
        assert len(vectorised) >= 1
        assert_same(vectorised, IncrementalBars(spec, bars, HealthConfig()).push_records(records))


def test_parity_across_instruments_through_the_router() -> None:
    es = faulty_book(6000, seed=1)
    nq = random_book(5000, seed=2, instrument_id=1002)
    mixed = np.concatenate([es, nq, random_book(40, seed=3, instrument_id=5)])
    mixed = mixed[np.argsort(mixed["ts_recv"], kind="stable")]
    specs = [SPEC, InstrumentSpec(symbol="NQ", instrument_id=1002)]
    bars = BarConfig(clock="time", interval_s=0.5)
    result = compute_all(mixed, specs, bars, HEALTH)
    router = IncrementalFeatures(specs, bars, HEALTH)
    closed = router.push_records(mixed)
    assert router.rejected == result.rejected_records == 40
    for spec in specs:
        mine = [f for f in closed if f.instrument_id == spec.instrument_id]
        assert len(mine) == 1  # one frame per instrument and call, its bars in close order
        alone = compute_bars(mixed[mixed["instrument_id"] == spec.instrument_id], spec, bars, HEALTH)
        assert_same(alone, mine)
        np.testing.assert_array_equal(result.frames[spec.symbol].features, alone.features)


def test_parity_in_small_batches_through_the_router() -> None:
    """Batches of a few records per instrument (a live run) are routed record by record and
    judged with the scalar form of the rules; larger ones take the array form: the same bars."""
    mixed, specs = mixed_feed()
    bars = BarConfig(clock="time", interval_s=0.5)
    router = IncrementalFeatures(specs, bars, HEALTH)
    sizes = np.random.default_rng(8).choice([1, 3, 20, 95, 200, 700], size=len(mixed))
    cuts = np.cumsum(sizes)
    closed = [f for part in np.split(mixed, cuts[cuts < len(mixed)]) for f in router.push_records(part)]
    assert router.rejected == 30
    for spec in specs:
        monitor = HealthMonitor(spec.instrument_id, spec.symbol)
        alone = compute_bars(mixed[mixed["instrument_id"] == spec.instrument_id], spec, bars, HEALTH, monitor)
        assert_same(alone, [f for f in closed if f.instrument_id == spec.instrument_id])
        assert episodes(monitor) == episodes(router.by_id[spec.instrument_id].monitor)
        assert monitor.counters == router.by_id[spec.instrument_id].monitor.counters


def test_closing_looks_ahead_without_pushing() -> None:
    """closing says whether pushing a batch would close a bar (time clock: once the first
    bar is known), counting the event clock's records over the batches not pushed yet."""
    records = random_book(600, seed=9, mean_gap_ns=10_000_000)
    sizes = np.resize([1, 4, 2, 5, 3], len(records))
    cuts = np.cumsum(sizes)
    batches = np.split(records, cuts[cuts < len(records)])
    for bars in (BarConfig(clock="time", interval_s=0.2), BarConfig(clock="events", events=7)):
        router = IncrementalFeatures([SPEC], bars, HEALTH)
        router.push_records(batches[0])
        verdicts = []
        for batch in batches[1:]:
            says = router.closing(batch, collections.Counter())
            assert says == ([SPEC.instrument_id] if router.push_records(batch) else [])
            verdicts.append(bool(says))
        assert any(verdicts) and not all(verdicts)
    router = IncrementalFeatures([SPEC], BarConfig(clock="events", events=7), HEALTH)
    pending: collections.Counter[int] = collections.Counter()
    assert [router.closing(records[k : k + 3], pending) for k in (0, 3, 6)] == [[], [], [SPEC.instrument_id]]
    assert pending == {SPEC.instrument_id: 9}


def test_parity_on_a_synthetic_session() -> None:
    spec = InstrumentSpec(symbol="ES", instrument_id=1001, session_start="14:00", session_end="15:00")
    day = simulate_session(spec, dt.date(2024, 1, 3), SynthConfig(), seed=3, open_tick=20_000)
    for bars in (BarConfig(clock="time", interval_s=1.0), BarConfig(clock="events", events=20)):
        monitor = HealthMonitor(spec.instrument_id, spec.symbol)
        vectorised = compute_bars(day.records, spec, bars, HealthConfig(), monitor)
        assert vectorised.tradable.all()  # the generator's feed is healthy
        assert monitor.episodes == []
        assert_same(vectorised, IncrementalBars(spec, bars, HealthConfig()).push_records(day.records))


def mixed_feed() -> tuple[np.ndarray, list[InstrumentSpec]]:
    """Two interleaved instruments (one faulty, with silences) and an unknown one."""
    es = faulty_book(6000, seed=4)
    nq = random_book(5000, seed=5, instrument_id=1002)
    mixed = np.concatenate([es, nq, random_book(30, seed=6, instrument_id=9)])
    mixed = mixed[np.argsort(mixed["ts_recv"], kind="stable")]
    return mixed, [SPEC, InstrumentSpec(symbol="NQ", instrument_id=1002)]


def assert_same_set(expected: FeatureSet, got: FeatureSet) -> None:
    assert got.rejected_records == expected.rejected_records
    assert list(got.frames) == list(expected.frames)
    for symbol, frame in expected.frames.items():
        assert_same(frame, [got.frames[symbol]])
        assert episodes(got.monitors[symbol]) == episodes(expected.monitors[symbol])
        assert got.monitors[symbol].counters == expected.monitors[symbol].counters


@pytest.mark.parametrize(
    "bars",
    [BarConfig(clock="time", interval_s=0.5), BarConfig(clock="events", events=37)],
    ids=["time", "events"],
)
def test_chunking_does_not_change_the_bars(bars: BarConfig) -> None:
    mixed, specs = mixed_feed()
    whole = compute_all(mixed, specs, bars, HEALTH)
    rng = np.random.default_rng(0)
    for cuts in (
        np.arange(0, len(mixed), 1000),
        np.sort(rng.choice(len(mixed), 40, replace=False)),
        np.arange(0, 400),  # one record per chunk, then the rest at once
    ):
        stream = FeatureStream(specs, bars, HEALTH)
        closes: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {s.instrument_id: [] for s in specs}
        for part in np.split(mixed, cuts):
            for iid, closed in stream.push(part).items():
                closes[iid].append(closed)
        result = stream.result()
        assert_same_set(whole, result)
        for spec in specs:  # each chunk reports the bars it closed
            index, close_ts = (np.concatenate(c) for c in zip(*closes[spec.instrument_id], strict=True))
            assert np.array_equal(index, result.frames[spec.symbol].close_index)
            assert np.array_equal(close_ts, result.frames[spec.symbol].ts_close)


@pytest.mark.parametrize("suffix", [".dbn", ".dbn.zst"])
def test_compute_file_reads_in_chunks_and_agrees_with_compute_all(tmp_path, suffix: str) -> None:
    mixed, specs = mixed_feed()
    mixed = mixed[mixed["instrument_id"] != 9]
    ts = mixed["ts_recv"]
    path = write_mbp10(
        tmp_path / f"feed{suffix}",
        mixed,
        dataset="SYNTH",
        symbols={1001: "ES", 1002: "NQ"},
        start_ns=int(ts[0]),
        end_ns=int(ts[-1]) + 1,
    )
    bars = BarConfig(clock="time", interval_s=0.5)
    expected = compute_all(mixed, specs, bars, HEALTH)
    assert_same_set(expected, compute_file(path, specs, bars, HEALTH, chunk_records=1000))
