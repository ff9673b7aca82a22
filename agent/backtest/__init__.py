"""Replay backtests: the daemon's pipeline on a simulated clock, and a vectorised driver.

Public surface: :func:`agent.backtest.run.run_backtest` with :class:`~agent.backtest.run.BacktestRequest`
(results in :class:`~agent.backtest.run.BacktestResult`), :func:`agent.reports.backtest.write_backtest`,
and :class:`~agent.backtest.errors.BacktestError`.
"""
