"""Health checks: each rule, its counter, its episode (logged once), and the tradable mask."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.dbn import read_mbp10
from feeds.features import IncrementalBars, compute_all, compute_bars
from feeds.health import Check, HealthMonitor
from feeds.records import ACTION_TRADE, SIDE_ASK
from tests.conftest import DBN_SAMPLES
from tests.feeds.recbuild import T0, Row, book_records

SPEC = InstrumentSpec(symbol="ES", instrument_id=1001)
EVERY_RECORD = BarConfig(clock="events", events=1)
HEALTH = HealthConfig(stale_after_s=5.0, max_price_jump_ticks=100)
MS = 1_000_000
S = 1_000_000_000


def run(rows: list[Row], health: HealthConfig = HEALTH) -> tuple[np.ndarray, HealthMonitor]:
    monitor = HealthMonitor(SPEC.instrument_id, SPEC.symbol)
    frame = compute_bars(book_records(rows), SPEC, EVERY_RECORD, health, monitor)
    assert np.isfinite(frame.features).all()
    return frame.tradable, monitor


@pytest.mark.parametrize(
    ("check", "bad"),
    [
        (Check.CROSSED, Row(ts=2 * MS, bid=4001, ask=4001)),  # locked
        (Check.CROSSED, Row(ts=2 * MS, bid=4003, ask=4001)),  # crossed
        (Check.EMPTY_SIDE, Row(ts=2 * MS, bid=None)),
        (Check.EMPTY_SIDE, Row(ts=2 * MS, ask=None)),
        (Check.BAD_PRICE, Row(ts=2 * MS, bid=0)),
        (Check.BAD_PRICE, Row(ts=2 * MS, action=ACTION_TRADE, side=SIDE_ASK, price=-3)),
        (Check.TIME_BACKWARDS, Row(ts=MS // 2)),
        (Check.SEQUENCE, Row(ts=2 * MS, seq=1)),
    ],
)
def test_one_bad_record_is_one_episode(check: Check, bad: Row, caplog: pytest.LogCaptureFixture) -> None:
    rows = [Row(ts=MS, seq=10), dataclasses.replace(bad, seq=bad.seq or 11), Row(ts=3 * MS, seq=12)]
    with caplog.at_level(logging.INFO, logger="feeds.health"):
        tradable, monitor = run(rows)
    assert tradable.tolist() == [True, False, True]
    assert monitor.counters[check] == 1
    assert sum(monitor.counters.values()) == 1
    (episode,) = monitor.episodes
    assert (episode.check, episode.count) == (check, 1)
    assert episode.start_ns == T0 + bad.ts
    assert episode.end_ns == T0 + 3 * MS
    assert monitor.state.healthy
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(check) in warnings[0].getMessage()


def test_price_jump_and_return_are_both_absurd() -> None:
    rows = [Row(ts=MS), Row(ts=2 * MS, bid=9000, ask=9001), Row(ts=3 * MS), Row(ts=4 * MS)]
    tradable, monitor = run(rows)
    assert tradable.tolist() == [True, False, False, True]
    (episode,) = monitor.episodes
    assert (episode.check, episode.count, episode.end_ns) == (Check.BAD_PRICE, 2, T0 + 4 * MS)


def test_a_long_episode_is_counted_once_with_its_length() -> None:
    rows = [Row(ts=i * MS, bid=None if 3 <= i < 8 else 4000) for i in range(1, 12)]
    tradable, monitor = run(rows)
    assert tradable.tolist() == [i not in range(3, 8) for i in range(1, 12)]
    (episode,) = monitor.episodes
    assert (episode.start_ns, episode.end_ns, episode.count) == (T0 + 3 * MS, T0 + 8 * MS, 5)


def test_forward_sequence_gap_only_when_configured() -> None:
    rows = [Row(ts=MS, seq=1), Row(ts=2 * MS, seq=2), Row(ts=3 * MS, seq=9), Row(ts=4 * MS, seq=10)]
    tradable, monitor = run(rows)
    assert tradable.all()
    tradable, monitor = run(rows, HealthConfig(max_sequence_gap=1))
    assert tradable.tolist() == [True, True, False, True]
    assert monitor.counters[Check.SEQUENCE] == 1


def test_stale_feed_marks_bars_and_records_one_episode() -> None:
    rows = [Row(ts=i * 100 * MS) for i in range(1, 6)] + [Row(ts=20 * S + i * 100 * MS) for i in range(5)]
    monitor = HealthMonitor(SPEC.instrument_id, SPEC.symbol)
    frame = compute_bars(book_records(rows), SPEC, BarConfig(clock="time", interval_s=1.0), HEALTH, monitor)
    (episode,) = monitor.episodes
    assert episode.check is Check.STALE
    assert (episode.start_ns, episode.end_ns) == (T0 + 500 * MS + 5 * S, T0 + 20 * S)
    # bars close at 1 s, 2 s, ...: fresh until 5.5 s, then one stale bar (6 s) and a skip to 20 s
    closes = (frame.ts_close - T0) // S
    assert closes.tolist() == [1, 2, 3, 4, 5, 6, 20]
    assert frame.tradable.tolist() == [True, True, True, True, True, False, True]
    assert frame.n_records.tolist() == [5, 0, 0, 0, 0, 0, 1]
    # carried book: the empty bars repeat the book of the last record
    assert (frame.mid_ticks[:6] == frame.mid_ticks[0]).all()


def test_live_clock_staleness_and_transport_gaps() -> None:
    bars = IncrementalBars(SPEC, BarConfig(clock="time", interval_s=1.0), HEALTH)
    records = book_records([Row(ts=100 * MS), Row(ts=1100 * MS), Row(ts=1200 * MS), Row(ts=9 * S)])
    assert bars.push(records[0].tobytes()) is None
    first = bars.push(records[1].tobytes())
    assert first is not None and first.tradable.tolist() == [True]
    bars.report_gap(T0 + 1150 * MS)
    assert bars.monitor.state.reasons == (Check.GAP,)
    assert bars.push(records[2].tobytes()) is None
    assert bars.monitor.state.healthy  # the gap ended with the next record...
    due = bars.poll(T0 + 7 * S)  # ...but the bar holding it is not tradable; stale from 6.2 s
    assert due is not None
    assert ((due.ts_close - T0) // S).tolist() == [2, 3, 4, 5, 6]
    assert due.tradable.tolist() == [False, True, True, True, True]
    assert bars.monitor.state.reasons == (Check.STALE,)
    late = bars.poll(T0 + 9 * S)  # the first bar closing stale (7 s) comes, later empty ones are skipped
    assert late is not None
    assert ((late.ts_close - T0) // S).tolist() == [7]
    assert late.tradable.tolist() == [False]
    assert bars.poll(T0 + 9 * S) is None
    bars.push(records[3].tobytes())
    assert bars.monitor.state.healthy
    stale = [e for e in bars.monitor.episodes if e.check is Check.STALE]
    assert [(e.start_ns, e.end_ns) for e in stale] == [(T0 + 6200 * MS, T0 + 9 * S)]
    assert bars.monitor.counters[Check.GAP] == 1


def test_official_samples_are_healthy() -> None:
    for path in sorted(DBN_SAMPLES.glob("test_data.mbp-10*.dbn*")):
        records = read_mbp10(path)
        spec = InstrumentSpec(symbol="ESH1", instrument_id=int(records["instrument_id"][0]))
        result = compute_all(records, [spec], EVERY_RECORD, HealthConfig())
        assert result.rejected_records == 0
        assert result.frames["ESH1"].tradable.all()
        assert sum(result.monitors["ESH1"].counters.values()) == 0


def test_sequence_restart_after_a_silence_is_a_new_session() -> None:
    rows = [Row(ts=MS, seq=500), Row(ts=2 * MS, seq=501), Row(ts=20 * S, seq=1), Row(ts=20 * S + MS, seq=2)]
    tradable, monitor = run(rows)
    assert tradable.all()
    assert monitor.counters[Check.SEQUENCE] == 0
    assert [e.check for e in monitor.episodes] == [Check.STALE]
