"""The decision clock: boundary convention, empty and stale bars, event bars, both paths agree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feeds.bars import BarClock, clock_closes, plan_bars
from feeds.config import BarConfig
from feeds.errors import FeedError

S = 1_000_000_000
T0 = 1_700_000_000 * S
STALE = 5 * S


def test_time_bar_covers_left_open_right_closed_interval() -> None:
    ts = T0 + np.array([S // 2, S, 3 * S // 2, 27 * S // 10], dtype=np.int64)
    plan = plan_bars(ts, BarConfig(clock="time", interval_s=1.0), STALE)
    # (0, 1 s] holds 0.5 s and 1.0 s; (1 s, 2 s] holds 1.5 s; the bar holding 2.7 s is still open
    assert plan.ends.tolist() == [2, 3]
    assert (plan.close_ts - T0).tolist() == [S, 2 * S]


def test_event_bars_close_on_every_nth_record() -> None:
    ts = T0 + np.arange(250, dtype=np.int64)
    plan = plan_bars(ts, BarConfig(clock="events", events=100), STALE)
    assert plan.ends.tolist() == [100, 200]
    assert plan.close_ts.tolist() == [ts[99], ts[199]]


def test_bad_clock_settings_are_clear_errors() -> None:
    with pytest.raises(FeedError, match="interval_s"):
        plan_bars(np.array([T0]), BarConfig(interval_s=0.0), STALE)
    with pytest.raises(FeedError, match="events"):
        BarClock(BarConfig(clock="events", events=0), STALE)


def replay(ts: np.ndarray, config: BarConfig) -> tuple[list[int], list[int]]:
    """Ends and close times from BarClock fed one record at a time."""
    clock = BarClock(config, STALE)
    ends: list[int] = []
    closes: list[int] = []
    for i, t in enumerate(ts.tolist()):
        for close in clock.on_record(t):
            ends.append(i)
            closes.append(close)
        if clock.after_record():
            ends.append(i + 1)
            closes.append(clock.clock_ts)
    return ends, closes


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=12 * S), min_size=1, max_size=60),
    back=st.lists(st.integers(min_value=0, max_value=59), max_size=3),
    interval=st.sampled_from([0.25, 1.0, 3.0]),
    events=st.integers(min_value=1, max_value=7),
)
def test_incremental_clock_equals_vectorised_plan(
    gaps: list[int], back: list[int], interval: float, events: int
) -> None:
    ts = T0 + np.cumsum(np.array(gaps, dtype=np.int64))
    for i in back:  # a few records that go back in time
        if i < len(ts):
            ts[i] -= 2 * S
    clock_ts = np.maximum.accumulate(ts)
    for config in (BarConfig(clock="time", interval_s=interval), BarConfig(clock="events", events=events)):
        plan = plan_bars(clock_ts, config, STALE)
        ends, closes = replay(ts, config)
        assert plan.ends.tolist() == ends
        assert plan.close_ts.tolist() == closes
        assert np.all(np.diff(plan.close_ts) > 0) or config.clock == "events"


def test_clock_closes_are_time_bars_whose_closer_came_after_the_grace() -> None:
    time_bars, event_bars = BarConfig(clock="time", interval_s=1.0), BarConfig(clock="events", events=10)
    grace = 50_000_000
    close_ts = np.array([1_000_000_000, 2_000_000_000, 3_000_000_000])
    closer = close_ts + np.array([1, grace, grace + 1])  # the grace itself is not late
    np.testing.assert_array_equal(clock_closes(closer, close_ts, time_bars, grace), [False, False, True])
    assert not clock_closes(closer, close_ts, event_bars, grace).any()
    # one record's values, as the event-driven driver asks
    assert clock_closes(int(closer[2]), int(close_ts[2]), time_bars, grace) is True
    assert clock_closes(int(closer[1]), int(close_ts[1]), time_bars, grace) is False
    assert clock_closes(int(closer[2]), int(close_ts[2]), event_bars, grace) is False
