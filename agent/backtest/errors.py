"""Errors of the replay backtest.

::

    AgentError
    └── BacktestError        the backtest cannot run on this input: fix the data, dates or checkpoint
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["BacktestError"]


class BacktestError(AgentError):
    """The backtest cannot run on this input; the message says what to fix."""
