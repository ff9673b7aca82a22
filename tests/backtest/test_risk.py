"""The event-driven backtest applies the daemon's hard limits on the feed clock: a daily-loss
breach flattens every position and halts new orders for the rest of the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.backtest.run import BacktestRequest, run_backtest
from tests.backtest.conftest import backtest_config
from tests.backtest.test_parity import _Quiet


def test_daily_loss_breach_flattens_and_halts(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path
) -> None:
    config = backtest_config(tmp_path / "state", max_daily_loss=40.0)
    result = run_backtest(
        config, BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file), fast=False), _Quiet()
    )
    s = result.summary
    assert s.halt_reason.startswith("daily loss"), s.halt_reason
    assert s.health.get("risk_halts") == 1
    books = result.books
    order = np.argsort(books.ts_ns, kind="stable")
    equity = np.cumsum(books.pnl[order])
    breach = int(np.argmax(equity <= -40.0))
    # after the breach the only trades are the flattening ones: at most one per instrument
    assert books.traded[order][breach + 1 :].sum() <= len(result.symbols)
    for i in range(len(result.symbols)):
        assert result.books.position[result.books.instrument == i][-1] == 0
