"""The observation row: what the model sees of one bar and of the agent's own state.

One implementation for the daemon, both backtest drivers and the trainer's as-traded
evaluation (:mod:`agent.trading.step`); the training environment builds the same two agent
columns with :func:`agent.train.env.agent_features`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agent.train.env import agent_features

__all__ = ["observation_rows"]

F64 = npt.NDArray[np.float64]


def observation_rows(
    features: npt.NDArray[np.float32],
    *,
    positions: npt.NDArray[np.int64],
    entry_px: F64,
    mid_ticks: F64,
    tick_px: F64,
    reward_scale: float,
) -> npt.NDArray[np.float32]:
    """Rows ``[B, F + 2]`` for the engine: market features ``[B, F]`` plus the agent's unit
    position and unrealised P&L (``sign(pos) * (mid_ticks - entry_px / tick_px)`` in ticks,
    normalised and clipped, :func:`agent.train.env.agent_features`: the columns the training
    environment gives its windows). ``entry_px`` is the average
    entry price of the open position (1e-9 fixed point, ignored when flat), ``mid_ticks`` the bar
    frame's close mid in ticks and ``tick_px`` the tick in fixed point."""
    unit = np.sign(positions).astype(np.float64)
    upnl = np.where(positions != 0, unit * (mid_ticks - entry_px / tick_px), 0.0)
    agent = agent_features(np, unit.astype(np.float32), upnl, reward_scale)
    return np.concatenate([np.asarray(features, dtype=np.float32), agent], axis=1)
