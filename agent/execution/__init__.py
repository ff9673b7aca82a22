"""Execution: order lifecycle, the paper broker, the ZeroMQ gateway protocol and its reference gateway.

The fill and P&L maths lives in :mod:`agent.execution.fills` (shared with the trainer and the
backtest); everything else here is order state, transport and bookkeeping.
"""
