"""Action choice over C51 distributions (ALGORITHMS.md section 3), NumPy reference: Thompson
sampling (the trainer's exploration, and ``policy.selection = "thompson"``) and the greedy
choice (the default ``policy.selection``).

For each row and action one atom is drawn from the action's categorical distribution by the
inverse CDF, with one Philox uniform per action; the action with the largest drawn value wins,
ties going to the lowest action index. The CDF is accumulated in float32 in index order, and
the threshold is ``u * CDF[N-1]`` (so probabilities need not sum exactly to one), exactly as the
CUDA kernel (``agent/kernels/thompson.cu``) does it: from identical probabilities both choose
identical actions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from agent.policy.philox import Purpose, philox_uniforms

__all__ = ["MAX_ACTIONS", "ThompsonDraw", "greedy_ref", "thompson_ref"]

MAX_ACTIONS = 4
"""One Philox call gives four uniforms: the action set is at most four actions."""


class ThompsonDraw(NamedTuple):
    action: npt.NDArray[np.int32]
    """(B,) chosen action index in [0, A)."""
    value: npt.NDArray[np.float32]
    """(B, A) drawn atom value of each action."""


def thompson_ref(
    probs: npt.ArrayLike,
    support: npt.ArrayLike,
    seed: int,
    env: npt.ArrayLike,
    step: npt.ArrayLike,
) -> ThompsonDraw:
    """Draw one atom per action and pick the argmax.

    Args:
        probs: (B, A, N) float32 probabilities per action over the atoms (non-negative).
        support: (N,) float32 atom values z_0 < ... < z_{N-1}.
        seed: Philox key (``PolicyConfig.seed``).
        env: (B,) instrument slot / environment index of each row.
        step: (B,) decision index of each row.
    """
    p = np.asarray(probs, dtype=np.float32)
    z = np.asarray(support, dtype=np.float32)
    if p.ndim != 3 or p.shape[2] != z.shape[0] or not 1 <= p.shape[1] <= MAX_ACTIONS:
        raise ValueError(f"thompson_ref wants probs (B, A<={MAX_ACTIONS}, N) and support (N,), got {p.shape}")
    n_atoms = p.shape[2]
    u = philox_uniforms(seed, env, step, Purpose.THOMPSON)[:, : p.shape[1]]  # (B, A)
    cdf = np.add.accumulate(p, axis=2, dtype=np.float32)  # sequential float32 sums, index order
    threshold = (u * cdf[:, :, -1]).astype(np.float32)
    above = cdf > threshold[:, :, None]
    j = np.where(above.any(axis=2), np.argmax(above, axis=2), n_atoms - 1)  # first j with CDF[j] > t
    value = z[j]
    return ThompsonDraw(np.argmax(value, axis=1).astype(np.int32), value)


def greedy_ref(q: npt.ArrayLike) -> npt.NDArray[np.int32]:
    """(B,) action with the largest expected Q of each row of ``q`` (B, A), ties to the lowest
    action index (``policy.selection = "greedy"``; ``decide.cu`` takes the argmax of its own Q)."""
    action: npt.NDArray[np.int32] = np.argmax(np.asarray(q), axis=1).astype(np.int32)
    return action
