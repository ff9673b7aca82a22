"""The baselines are what they claim: always long enters once per instrument and holds to the
end of the window (as the daemon would hold it), paying one leg, not a round trip per chunk."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.backtest.api import BacktestRequest, run_backtest
from tests.backtest.conftest import backtest_config
from tests.backtest.test_parity import _Quiet


def test_always_long_enters_once_per_instrument_and_holds(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path
) -> None:
    config = backtest_config(tmp_path / "state")
    contracts = config.policy.max_contracts
    # the model's driver chunked as finely as it goes: the baselines do not follow its chunks
    request = BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file), fast=True, chunks=64)
    result = run_backtest(config, request, _Quiet())
    long = result.baselines["long"]
    for i, symbol in enumerate(result.symbols):
        mine = long.instrument == i
        days = np.unique(long.ts_ns[mine] // 86_400_000_000_000)
        assert days.size == 2, "two sessions of this instrument in the window"
        entries = np.flatnonzero(long.traded[mine])
        # one entry of max_contracts over both sessions (at most one per session), then held
        assert entries.size == 1 and long.traded[mine][entries[0]] == contracts, symbol
        assert (long.position[mine][entries[0] :] == contracts).all()
        assert (long.position[mine][: entries[0]] == 0).all()
        # its costs are that one leg's (fee and slippage against the mid)
        costs = long.cost[mine]
        assert costs[entries[0]] > 0 and np.count_nonzero(costs) == 1
    flat = result.baselines["flat"]
    assert not flat.traded.any() and not flat.pnl.any()
