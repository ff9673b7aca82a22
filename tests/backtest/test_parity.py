"""Both drivers give the same decisions, trades and P&L on the same data for a fixed model and
seed (the vectorised one with one span per instrument), and the event-driven run's ledger agrees
with its books; the gate's exact request gives the event-driven result by either route."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import numpy as np
import pytest

from agent.backtest.api import BacktestRequest, BacktestResult, run_backtest
from agent.config import Config
from agent.execution.fills import OrderSchedule, order_schedule
from feeds.config import BarConfig
from feeds.dbn import read_mbp10
from feeds.records import MBP10_DTYPE
from tests.backtest.conftest import backtest_config


class _Quiet:
    def start(self, name: str, total: int) -> None:
        return None

    def advance(self, name: str, amount: int = 1) -> None:
        return None


def _run(data: Path, ckpt: Path, config: Config, *, fast: bool) -> BacktestResult:
    return run_backtest(
        config, BacktestRequest(data=data, checkpoint=str(ckpt), fast=fast, chunks=1), _Quiet()
    )


BARS = {"time": None, "events": BarConfig(clock="events", events=6)}
"""The default one-second bars (most decided on the clock on this thin feed), and event bars
(each decided at its own last record)."""


@pytest.mark.parametrize("clock", list(BARS))
def test_event_and_fast_drivers_agree(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path, clock: str
) -> None:
    config = backtest_config(tmp_path / "state")
    bars = BARS[clock]
    if bars is not None:
        config = msgspec.structs.replace(config, feeds=msgspec.structs.replace(config.feeds, bars=bars))
    event = _run(signal_data, checkpoint_file, config, fast=False)
    fast = _run(signal_data, checkpoint_file, config, fast=True)
    assert event.summary.fills > 20, "the model should trade on this data"
    for key in ("ts_ns", "instrument", "bar", "action", "valid", "target", "position"):
        np.testing.assert_array_equal(event.decisions[key], fast.decisions[key], err_msg=key)
    np.testing.assert_allclose(event.decisions["size"], fast.decisions["size"], rtol=0, atol=0)
    np.testing.assert_allclose(event.decisions["regime"], fast.decisions["regime"], rtol=0, atol=0)
    np.testing.assert_array_equal(event.books.position, fast.books.position)
    np.testing.assert_allclose(event.books.pnl, fast.books.pnl, rtol=0, atol=1e-6)
    assert event.summary.fills == fast.summary.fills
    assert abs(event.summary.performance.pnl - fast.summary.performance.pnl) < 1e-6
    # the SQL ledger rebuilt from the recorded fills says the same as the books
    assert event.summary.ledger_pnl is not None
    assert abs(event.summary.ledger_pnl - event.summary.performance.pnl) < 1e-6
    assert set(event.summary.baselines) == {"flat", "random", "long"}
    assert event.summary.baselines["flat"].pnl == 0.0
    # both count the bars decided on the clock, as the records say
    on_clock = event.summary.health["clock_close_bars"]
    assert on_clock == fast.summary.health["clock_close_bars"]
    if clock == "time":
        assert on_clock == _clock_close_bars(signal_data, event)
        assert 0 < on_clock < event.summary.bars  # this synthetic feed is thin: most bars wait for a record
    else:
        assert on_clock == 0


def _clock_close_bars(data: Path, result: BacktestResult) -> int:
    """The bars whose instrument's first record past the bar's close came more than the grace
    after it, from the records: the first record stamped after the close, per instrument."""
    config = backtest_config(Path("unused"))
    grace = config.daemon.close_grace_ns
    records = read_mbp10(data)
    count = 0
    for i, spec in enumerate(config.feeds.instruments):
        clock = np.maximum.accumulate(records["ts_recv"][records["instrument_id"] == spec.instrument_id])
        close = result.decisions["ts_ns"][result.decisions["instrument"] == i].astype(np.int64)
        closer = clock[np.searchsorted(clock, close, side="right")].astype(np.int64)
        count += int(np.count_nonzero(closer - close > grace))
    return count


def test_chunked_fast_driver_trades_every_span(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path
) -> None:
    config = backtest_config(tmp_path / "state")
    one = run_backtest(
        config,
        BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file), fast=True, chunks=1),
        _Quiet(),
    )
    many = run_backtest(
        config,
        BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file), fast=True, chunks=8),
        _Quiet(),
    )
    assert many.summary.bars == one.summary.bars
    # every span ends flat, so the instruments' positions are flat at each span end and at the end
    assert np.all(np.isfinite(many.books.pnl))
    assert many.summary.fills > 0


def _latency_config(tmp: Path, latency_ms: float) -> Config:
    config = backtest_config(tmp / "state")
    return msgspec.structs.replace(
        config, broker=msgspec.structs.replace(config.broker, latency_ms=latency_ms)
    )


@pytest.mark.parametrize(
    ("latency_ms", "mode"),
    [(5.0, "fast"), (4_000.0, "event")],
    ids=["orders-before-next-decision", "late-orders"],
)
def test_exact_request_gives_the_event_driven_result(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path, latency_ms: float, mode: str
) -> None:
    """The gate's request: the vectorised driver where it is exact, else the event-driven replay;
    either way the event-driven run's decisions, fills and P&L."""
    config = _latency_config(tmp_path, latency_ms)
    request = BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file))
    event = run_backtest(config, request, _Quiet())
    exact = run_backtest(config, dataclasses.replace(request, exact=True), _Quiet())
    assert exact.summary.mode == mode
    assert event.summary.fills > 20
    for key in ("ts_ns", "instrument", "bar", "action", "valid", "target", "position"):
        np.testing.assert_array_equal(event.decisions[key], exact.decisions[key], err_msg=key)
    np.testing.assert_allclose(event.books.pnl, exact.books.pnl, rtol=0, atol=1e-6)
    assert abs(event.summary.pnl - exact.summary.pnl) < 1e-6
    if mode == "event":  # the vectorised run would have decided bars before their fills
        fast = run_backtest(config, dataclasses.replace(request, fast=True, chunks=1), _Quiet())
        assert fast.summary.health["late_orders"] > 0
        assert not np.array_equal(fast.books.position, event.books.position)


def test_order_schedule_marks_orders_arriving_after_the_next_close() -> None:
    records = np.zeros(6, dtype=MBP10_DTYPE)
    records["instrument_id"] = [7, 7, 9, 7, 7, 7]
    records["ts_recv"] = [0, 100, 150, 200, 300, 1_000]
    # bars end at records 0, 1, 3 and 4 (the record after each one closes it: 1, 3, 4, 5)
    close_index = np.asarray([0, 1, 3, 4])
    close_ts = np.asarray([0, 100, 200, 300])  # 100 ns time bars
    bars = BarConfig(clock="time", interval_s=1e-7)

    def schedule(latency_ms: float, grace_ns: int) -> OrderSchedule:
        return order_schedule(records, 7, close_index, close_ts, latency_ms, bars=bars, grace_ns=grace_ns)

    late = schedule(0.0001, 10_000).late  # 100 ns; no bar waits past the grace
    # arrivals 200, 300, 400, 1_100 against the next bars' closing records 200, 300, 1_000
    np.testing.assert_array_equal(late, [True, True, False, False])
    assert not schedule(0.0, 10_000).late.any()
    # a grace of 20 ns: every closer comes later, so the bars are decided on the clock at 21,
    # 121, 221 and 321, each before its closer, and their orders meet the records before
    on_clock = schedule(0.0, 20)
    np.testing.assert_array_equal(on_clock.decided_ns, [21, 121, 221, 321])
    np.testing.assert_array_equal(on_clock.rows, [0, 1, 3, 4])
    # the next decision has seen the records at 100, 200 and 300: without latency each order
    # arrives before that record (it executes on it); at 100 ns (arrivals 121, 221, 321) after
    assert not on_clock.late.any()
    np.testing.assert_array_equal(schedule(0.0001, 20).late, [True, True, True, False])
