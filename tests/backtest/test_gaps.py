"""A recorded outage is replayed as it happened: the bar that sees the feed go stale is not
tradable, no bar is invented for the silence, no order is sent on a stale book, and both drivers
still agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.backtest.api import BacktestRequest, run_backtest
from feeds.dbn import read_mbp10, write_mbp10
from tests.backtest.conftest import backtest_config
from tests.backtest.test_parity import _Quiet
from tests.daemon.support import INSTRUMENTS

OUTAGE_S = 30


def test_recorded_gap_is_replayed_not_smoothed(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path
) -> None:
    records = read_mbp10(signal_data)
    es = INSTRUMENTS[0].instrument_id
    ts = records["ts_recv"].astype(np.int64)
    mid = int(ts[(ts.shape[0] // 4)])  # inside the first day's session
    hole = (records["instrument_id"] == es) & (ts >= mid) & (ts < mid + OUTAGE_S * 10**9)
    assert hole.sum() > 20
    kept = records[~hole]
    data = tmp_path / "gap"
    data.mkdir()
    write_mbp10(
        data / "gap.dbn.zst",
        kept,
        dataset="SYNTH",
        symbols={s.instrument_id: s.symbol for s in INSTRUMENTS},
        start_ns=int(ts[0]),
        end_ns=int(ts[-1]) + 1,
    )
    config = backtest_config(tmp_path / "state")
    event = run_backtest(
        config, BacktestRequest(data=data, checkpoint=str(checkpoint_file), fast=False), _Quiet()
    )
    fast = run_backtest(
        config, BacktestRequest(data=data, checkpoint=str(checkpoint_file), fast=True, chunks=1), _Quiet()
    )
    d = event.decisions
    es_rows = d["instrument"] == 0
    silent = es_rows & (d["ts_ns"] > mid + 7 * 10**9) & (d["ts_ns"] < mid + OUTAGE_S * 10**9)
    assert not silent.any(), "no bar is invented while the feed is silent"
    before = np.flatnonzero(es_rows & (d["ts_ns"] <= mid + 7 * 10**9))[-1]
    assert not d["valid"][before], "the bar that saw the feed go stale is not tradable"
    after = np.flatnonzero(es_rows & (d["ts_ns"] >= mid + OUTAGE_S * 10**9))[0]
    assert d["bar"][after] == d["bar"][before] + 1  # the next bar comes with the next record
    assert event.summary.health["episodes"] > 0 and event.summary.health["untradable_bars"] > 0
    books = event.books
    stale_bar = (books.instrument == 0) & (books.ts_ns == d["ts_ns"][before])
    assert stale_bar.sum() == 1 and books.traded[stale_bar][0] == 0, "no order on a stale book"
    np.testing.assert_array_equal(event.books.position, fast.books.position)
    assert abs(event.summary.performance.pnl - fast.summary.performance.pnl) < 1e-6
