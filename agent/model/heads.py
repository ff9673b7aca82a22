"""Reading the two heads: C51 support and probabilities, return-head bins and moments.

C51 (ALGORITHMS 2): support ``z_i = v_min + i dz``, ``dz = (v_max - v_min) / (atoms - 1)``;
``Q(s, a) = sum_i z_i p_i(s, a)``. Actions are ordered short, flat, long.

Return head: ``return_bins`` fixed centres evenly spaced on ``[-return_max_ticks,
return_max_ticks]``; a realised ``return_horizon``-bar mid return in ticks belongs to the
nearest centre, and returns beyond the outer centres belong to the outer bins.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from agent.model.arrays import Array, array_module
from agent.model.config import ModelConfig
from agent.model.errors import ModelError
from agent.model.ops import softmax

__all__ = [
    "ACTIONS",
    "c51_support",
    "expected_q",
    "q_probs",
    "ret_probs",
    "return_bin_centres",
    "return_bin_of",
    "return_moments",
]

ACTIONS: tuple[str, ...] = ("short", "flat", "long")
"""Action names in index order; the position direction of action a is ``a - 1``."""


def c51_support(cfg: ModelConfig, xp: ModuleType = np, dtype: type[np.floating] = np.float32) -> Array:
    """The atoms z (atoms,) on [v_min, v_max]."""
    return xp.linspace(cfg.v_min, cfg.v_max, cfg.n_atoms, dtype=dtype)


def return_bin_centres(cfg: ModelConfig, xp: ModuleType = np, dtype: type[np.floating] = np.float32) -> Array:
    """The return-head bin centres (bins,) in ticks."""
    return xp.linspace(-cfg.return_max_ticks, cfg.return_max_ticks, cfg.return_bins, dtype=dtype)


def q_probs(q_logits: Array) -> Array:
    """C51 probabilities (B, A, atoms) from logits (max-subtracted softmax over atoms)."""
    return softmax(q_logits, axis=-1)


def ret_probs(ret_logits: Array) -> Array:
    """Return-head probabilities (B, bins) from logits."""
    return softmax(ret_logits, axis=-1)


def expected_q(probs: Array, support: Array) -> Array:
    """Q values (B, A) = sum_i z_i p_i for probs (B, A, atoms)."""
    return (probs * support).sum(axis=-1)


def return_moments(probs: Array, centres: Array) -> tuple[Array, Array]:
    """Mean and variance (each (B,), in ticks) of the return head's distribution (B, bins)."""
    mean = (probs * centres).sum(axis=-1)
    var = (probs * (centres - mean[:, None]) ** 2).sum(axis=-1)
    return mean, var


def return_bin_of(ticks: Array, cfg: ModelConfig) -> Array:
    """Bin index (int64, same shape) of realised returns in ticks: the nearest centre, tails
    clamped into the outer bins. NaN or infinite returns raise :class:`ModelError` (the
    caller must drop those samples, never label them)."""
    xp = array_module(ticks)
    ticks = xp.asarray(ticks, dtype=xp.float64)
    if not bool(xp.isfinite(ticks).all()):
        raise ModelError("return_bin_of: realised returns contain NaN or Inf; drop those samples first")
    width = 2.0 * cfg.return_max_ticks / (cfg.return_bins - 1)
    index = xp.rint((ticks + cfg.return_max_ticks) / width)
    return xp.clip(index, 0, cfg.return_bins - 1).astype(xp.int64)
