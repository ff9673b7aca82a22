"""The baselines of :data:`agent.trading.decider.BASELINES` as policies of the training
environment, evaluated on the same test windows as the candidate (same costs, same health rules,
same chunking): ``flat`` (never trades: P&L 0), ``random`` (uniform over short, flat, long at
every bar, seeded) and ``long`` (always long). As traded, the baselines are
:class:`agent.trading.decider.BaselineDecider`."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from agent.model.arrays import Array
from agent.trading.decider import BASELINES
from agent.train.env import Policy

__all__ = ["baseline_policy"]


def baseline_policy(name: str, xp: ModuleType, seed: int) -> Policy:
    """The policy ``name`` of :data:`BASELINES`; ``random`` draws from a host generator seeded
    with ``seed`` (reproducible)."""
    if name == "flat":
        return lambda obs, t: xp.ones(obs.shape[0], dtype=np.int64)
    if name == "long":
        return lambda obs, t: xp.full(obs.shape[0], 2, dtype=np.int64)
    if name == "random":
        rng = np.random.default_rng(seed)

        def draw(obs: Array, t: Array) -> Array:
            return xp.asarray(rng.integers(0, 3, obs.shape[0]))

        return draw
    raise ValueError(f"unknown baseline {name!r} (known: {', '.join(BASELINES)})")
