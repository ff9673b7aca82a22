"""The event-driven backtest applies the daemon's hard limits on the feed clock: a daily-loss
breach flattens every position and halts new orders for the rest of the run. The vectorised
driver, which cannot halt, refuses a run in which a limit would have acted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import numpy as np
import pytest

from agent.backtest.api import BacktestRequest, run_backtest
from agent.backtest.errors import BacktestError
from agent.backtest.inputs import parse_bound
from agent.cli import main
from agent.config import Config
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


def test_the_fast_driver_enforces_nothing_it_cannot_simulate(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path
) -> None:
    """The vectorised driver has no order-rate or loss halt: a run in which one would have acted
    is refused, and its summary says which limits were enforced and which only checked."""
    request = BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file), fast=True, chunks=1)
    with pytest.raises(BacktestError, match=r"daily loss .* >= max_daily_loss 40\.00.*without --fast"):
        run_backtest(backtest_config(tmp_path / "a", max_daily_loss=40.0), request, _Quiet())
    with pytest.raises(BacktestError, match=r"more than max_orders_per_minute 3 orders in 60 s"):
        run_backtest(backtest_config(tmp_path / "b", max_orders_per_minute=3), request, _Quiet())
    loose = backtest_config(tmp_path / "c")
    fast = run_backtest(loose, request, _Quiet()).summary
    assert fast.risk_limits == "not binding" and fast.orders >= fast.fills > 20
    event = run_backtest(loose, dataclasses.replace(request, fast=False), _Quiet()).summary
    assert event.risk_limits == "enforced"
    limit = msgspec.structs.replace(loose, broker=msgspec.structs.replace(loose.broker, order_type="limit"))
    with pytest.raises(BacktestError, match="market orders only"):
        run_backtest(limit, request, _Quiet())


def test_the_cli_refuses_a_fast_run_that_a_limit_would_halt(
    signal_data: Path,
    checkpoint_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRADEAGENT_DATA_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TRADEAGENT__DEVICE", "cpu")
    monkeypatch.setenv("TRADEAGENT__RISK__MAX_DAILY_LOSS", "40")
    out = tmp_path / "out"
    args = ["backtest", "--data", str(signal_data), "--checkpoint", str(checkpoint_file), "--fast"]
    code = main([*args, "--out", str(out)])
    assert code == 2 and not out.exists()
    assert "the risk limits would have acted" in capsys.readouterr().err


def test_the_exact_request_judges_the_order_rate_at_the_orders_moments(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path
) -> None:
    """The gate's request keeps the vectorised result only when no limit would have acted, with
    the orders timed where the event-driven driver places them (many at a bar's clock close):
    at the smallest order-rate limit the event-driven run never throttles, the vectorised result
    stands; one below it, the event-driven one is replayed; both equal the event-driven run."""
    request = BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file))

    def config(limit: int) -> Config:
        return backtest_config(tmp_path / f"limit-{limit}", max_orders_per_minute=limit)

    def throttled(limit: int) -> int:
        return run_backtest(config(limit), request, _Quiet()).summary.health.get("throttled_orders", 0)

    low, high = 1, 64
    assert throttled(low) > 0 and throttled(high) == 0
    while low < high:  # the smallest limit that throttles nothing
        mid = (low + high) // 2
        low, high = (mid + 1, high) if throttled(mid) else (low, mid)
    for limit, mode in ((low - 1, "event"), (low, "fast")):
        event = run_backtest(config(limit), request, _Quiet())
        exact = run_backtest(config(limit), dataclasses.replace(request, exact=True), _Quiet())
        assert exact.summary.mode == mode, limit
        for key in ("ts_ns", "instrument", "bar", "action", "target", "position"):
            np.testing.assert_array_equal(event.decisions[key], exact.decisions[key], err_msg=key)
        np.testing.assert_allclose(event.books.pnl, exact.books.pnl, rtol=0, atol=1e-6)
