"""The books the vectorised driver's orders meet: :func:`agent.backtest.fast.load_bars` catches
them in its one decoding pass; they must be the records :func:`order_schedule` names, read here
the plain way (every record in memory)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from agent.backtest import fast
from agent.config import load_config
from agent.execution.fills import order_schedule
from feeds.book import levels_at
from feeds.config import BarConfig, InstrumentSpec
from feeds.dbn import read_mbp10, write_mbp10
from tests.feeds.recbuild import random_book

SPECS = [InstrumentSpec(symbol="ES", instrument_id=1001), InstrumentSpec(symbol="NQ", instrument_id=1002)]


@pytest.fixture(scope="module")
def feed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A busy ES and an NQ that trades rarely: NQ is quiet for whole chunks, so the record an
    NQ order meets often came several chunks before the one that settles it, and NQ's time bars
    are often decided on the clock. Both record counts are multiples of 8: the last event bar of
    each ends at the instrument's last record."""
    es = random_book(6000, seed=1, instrument_id=1001, mean_gap_ns=2_000_000)
    nq = random_book(80, seed=2, instrument_id=1002, mean_gap_ns=150_000_000)
    records = np.concatenate([es, nq])
    records = records[np.argsort(records["ts_recv"], kind="stable")]
    ts = records["ts_recv"]
    return write_mbp10(
        tmp_path_factory.mktemp("books") / "feed.dbn.zst",
        records,
        dataset="SYNTH",
        symbols={1001: "ES", 1002: "NQ"},
        start_ns=int(ts[0]),
        end_ns=int(ts[-1]) + 1,
    )


@pytest.mark.parametrize(
    "bars", [BarConfig(clock="time", interval_s=0.5), BarConfig(clock="events", events=8)]
)
@pytest.mark.parametrize("latency_ms", [0.0, 0.0001, 3.0, 900.0])
@pytest.mark.parametrize("grace_ms", [0.0, 50.0, 60_000.0])
def test_the_books_caught_in_one_pass_are_the_schedules(
    feed: Path, bars: BarConfig, latency_ms: float, grace_ms: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    grace_ns = round(grace_ms * 1e6)
    base = load_config(env={}).feeds
    feeds = msgspec.structs.replace(base, instruments=tuple(SPECS), bars=bars)
    records = read_mbp10(feed)
    for chunk in (5, 97, 1 << 16):
        monkeypatch.setattr(fast, "_CHUNK_RECORDS", chunk)
        got = fast.load_bars(feed, SPECS, feeds, 0, 2**62, latency_ms=latency_ms, close_grace_ns=grace_ns)
        assert got.n_records == records.shape[0]
        for spec in SPECS:
            frame = got.frames[spec.symbol]
            assert len(frame) > 5
            schedule = order_schedule(
                records,
                spec.instrument_id,
                frame.close_index,
                frame.ts_close,
                latency_ms,
                bars=bars,
                grace_ns=grace_ns,
            )
            books = got.books[spec.symbol]
            assert np.array_equal(books.late, schedule.late)
            assert np.array_equal(books.decided_ns, schedule.decided_ns)
            expected = levels_at(records, schedule.rows)
            assert books.levels.tobytes() == expected.tobytes(), (spec.symbol, chunk)


def test_the_driver_reads_the_books_where_they_were_caught(feed: Path) -> None:
    """The books of every instrument lie end to end in one array: the driver's columns take them
    as they are when its instruments come in that order (no copy of every bar's book), and
    concatenate them otherwise (another order, an instrument in several slots)."""
    base = load_config(env={}).feeds
    feeds = msgspec.structs.replace(base, instruments=tuple(SPECS), bars=BarConfig(clock="events", events=8))
    bars = fast.load_bars(feed, SPECS, feeds, 0, 2**62, latency_ms=3.0, close_grace_ns=50_000_000)
    for specs, in_place in ((SPECS, True), (SPECS[:1], True), (SPECS[::-1], False), ([SPECS[0]] * 2, False)):
        cols = fast._columns(bars, specs, [bars.frames[s.symbol] for s in specs])
        expected = np.concatenate([bars.books[s.symbol].levels for s in specs])
        assert cols.exec_levels.tobytes() == expected.tobytes()
        assert np.shares_memory(cols.exec_levels, bars.books[specs[0].symbol].levels) == in_place
