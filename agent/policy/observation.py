"""The observation row: what the model sees of one bar and of the agent's own state.

A row is the bar's market features (:data:`feeds.features.FEATURE_NAMES`) followed by the
:data:`AGENT_FEATURES` columns of :func:`agent_features`: the one definition of those columns.
The training environment (:mod:`agent.train.env`) builds its windows with it from the price its
execution model filled at; the vectorised backtest builds its rows with :func:`observation_rows`
from its positions' average fill price, and the trading step (:mod:`agent.trading.step`: the
daemon, the event-driven backtest and the trainer's as-traded evaluation) from the ledger's,
one row at a time with :func:`agent_feature_values` (the same arithmetic on Python floats: a
NumPy call costs more than one row's arithmetic). So a position (and the spread paid to open
it) looks the same to the model in training and in trading.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import numpy.typing as npt

from agent.model.arrays import Array

__all__ = ["AGENT_FEATURES", "UPNL_CLIP", "agent_feature_values", "agent_features", "observation_rows"]

AGENT_FEATURES: tuple[str, ...] = ("agent_position", "agent_unrealised")
UPNL_CLIP = 5.0

F64 = npt.NDArray[np.float64]


def agent_features(
    xp: ModuleType, position: Array, entry_ticks: Array, mark_ticks: Array, reward_scale: float
) -> Array:
    """The 2 agent feature columns ``[..., 2]`` (float32) of an observation row: the unit position
    ``sign(position)`` and its unrealised P&L ``sign(position) * (mark - entry)`` in ticks times
    ``reward_scale``, clipped to +/-``UPNL_CLIP`` (0 when flat).

    ``entry_ticks`` is the open position's average fill price and ``mark_ticks`` the bar's mark
    (the close mid), both in ticks. This is the one definition: the environment passes its entry
    fill (the price its execution model filled at: the spread paid is part of the unrealised
    P&L, as in a ledger), the daemon and both backtests the ledger's average fill price
    (:func:`observation_rows`), so a position looks the same to the model in training and in
    trading."""
    unit = xp.sign(xp.asarray(position, dtype=np.float64))
    upnl = xp.where(unit != 0, unit * (mark_ticks - entry_ticks), 0.0)
    # clip as minimum/maximum in place (the same values, NaN kept; cheaper on small arrays)
    upnl *= reward_scale
    xp.minimum(upnl, UPNL_CLIP, out=upnl)
    xp.maximum(upnl, -UPNL_CLIP, out=upnl)
    out = xp.empty((*unit.shape, 2), dtype=np.float32)
    out[..., 0] = unit
    out[..., 1] = upnl
    return out


def agent_feature_values(
    position: int, entry_ticks: float, mark_ticks: float, reward_scale: float
) -> tuple[float, float]:
    """:func:`agent_features` of one row on Python numbers: the same float64 operations in the
    same order (the sign, the difference, the product, the clip; NaN kept), so the values
    written into a float32 row are bit for bit those of the array form (the tests hold the two
    together)."""
    unit = float((position > 0) - (position < 0))
    if not unit:
        return unit, 0.0
    upnl = unit * (mark_ticks - entry_ticks)
    upnl *= reward_scale
    if upnl > UPNL_CLIP:  # NaN fails both comparisons and stays NaN, as in np.minimum/np.maximum
        upnl = UPNL_CLIP
    elif upnl < -UPNL_CLIP:
        upnl = -UPNL_CLIP
    return unit, upnl


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
    position and unrealised P&L (:func:`agent_features` of the position, its entry
    ``entry_px / tick_px`` and the mark ``mid_ticks``). ``entry_px`` is the ledger's average fill
    price of the open position (1e-9 fixed point, ignored when flat), ``mid_ticks`` the bar
    frame's close mid in ticks and ``tick_px`` the tick in fixed point."""
    agent = agent_features(np, positions, entry_px / tick_px, mid_ticks, reward_scale)
    return np.concatenate([np.asarray(features, dtype=np.float32), agent], axis=1)
