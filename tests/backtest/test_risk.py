"""The event-driven backtest applies the daemon's hard limits on the feed clock: a daily-loss
breach flattens every position and halts new orders for the rest of the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.backtest.inputs import parse_bound
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
    breach_ts = parse_bound(s.halt_at, "halt_at", end=False)
    # the halt latched once the loss reached the limit (the books mark the same P&L bar by bar)
    assert np.cumsum(books.pnl[order])[books.ts_ns[order] <= breach_ts][-1] <= -40.0
    # after the breach the only trades are the flattening ones: no more contracts per instrument
    # than it held at the breach, and it ends flat
    for i in range(len(result.symbols)):
        mine = books.instrument == i
        after = books.ts_ns[mine] > breach_ts
        held = np.abs(books.position[mine][~after])[-1] if (~after).any() else 0.0
        assert books.traded[mine][after].sum() <= held
        assert books.position[mine][-1] == 0
