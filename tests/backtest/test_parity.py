"""Both drivers give the same decisions, trades and P&L on the same data for a fixed model and
seed (the vectorised one with one span per instrument), and the event-driven run's ledger agrees
with its books."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.backtest.api import BacktestRequest, BacktestResult, run_backtest
from tests.backtest.conftest import backtest_config


class _Quiet:
    def start(self, name: str, total: int) -> None:
        return None

    def advance(self, name: str, amount: int = 1) -> None:
        return None


def _run(data: Path, ckpt: Path, tmp: Path, *, fast: bool) -> BacktestResult:
    config = backtest_config(tmp / "state")
    return run_backtest(
        config, BacktestRequest(data=data, checkpoint=str(ckpt), fast=fast, chunks=1), _Quiet()
    )


def test_event_and_fast_drivers_agree(signal_data: Path, checkpoint_file: Path, tmp_path: Path) -> None:
    event = _run(signal_data, checkpoint_file, tmp_path, fast=False)
    fast = _run(signal_data, checkpoint_file, tmp_path, fast=True)
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
