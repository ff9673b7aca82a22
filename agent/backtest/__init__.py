"""Replay backtests: the daemon's pipeline on a simulated clock, and a vectorised driver.

Public surface: :func:`agent.backtest.api.run_backtest` with :class:`~agent.backtest.api.BacktestRequest`
(results in :class:`~agent.backtest.api.BacktestResult`), :func:`agent.reports.backtest.write_backtest`,
and :class:`~agent.backtest.errors.BacktestError`.
"""
