"""The observation row: what the model sees of one bar and of the agent's own state.

One implementation for the daemon, both backtest drivers and the trainer's as-traded
evaluation (:mod:`agent.trading.step`); its two agent columns are
:func:`agent.train.env.agent_features`, the function the training environment builds its
windows with, so a position (and the spread paid to open it) looks the same to the model in
training and in trading.
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
    position and unrealised P&L (:func:`agent.train.env.agent_features` of the position, its
    entry ``entry_px / tick_px`` and the mark ``mid_ticks``). ``entry_px`` is the ledger's average
    fill price of the open position (1e-9 fixed point, ignored when flat), ``mid_ticks`` the bar
    frame's close mid in ticks and ``tick_px`` the tick in fixed point."""
    agent = agent_features(np, positions, entry_px / tick_px, mid_ticks, reward_scale)
    return np.concatenate([np.asarray(features, dtype=np.float32), agent], axis=1)
