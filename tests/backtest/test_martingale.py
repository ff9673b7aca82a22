"""On martingale data (``--signal 0``) the backtest path leaks nothing: a model, and the always-long
and random baselines, show no edge after costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.backtest.api import BacktestRequest, run_backtest
from tests.backtest.conftest import backtest_config, synth_days
from tests.backtest.test_parity import _Quiet


@pytest.mark.parametrize("seed", [21, 22])
def test_no_edge_after_costs_on_martingale_data(seed: int, checkpoint_file: Path, tmp_path: Path) -> None:
    data = synth_days(tmp_path / "data", signal=0.0, days=2, seed=seed)
    result = run_backtest(
        backtest_config(tmp_path / "state"),
        BacktestRequest(data=data, checkpoint=str(checkpoint_file), fast=True, chunks=4),
        _Quiet(),
    )
    perf = result.summary.performance
    assert result.summary.fills > 20
    assert perf.costs > 0
    assert perf.pnl < 0, f"a model earned {perf.pnl:.2f} after costs on martingale data"
    # before costs the model's P&L is noise: smaller than what it paid to trade
    assert abs(perf.pnl + perf.costs) < perf.costs
    assert result.summary.baselines["random"].pnl < 0
