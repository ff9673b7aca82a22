"""Replay memory on the device, with n-step returns.

A transition does not copy its observation: it stores the decision bar index ``t`` into the
fold's :class:`agent.train.env.EnvData` and the agent-feature history ``[K, 2]`` of that moment;
the window is gathered again when the transition is sampled. That keeps a million transitions in
a few hundred MB even for long windows.

n-step (:class:`NStepBuffer`): for the transition that started ``n`` lockstep steps ago,
``R = sum_{k<n} gamma^k r_k`` truncated at the first terminal, ``discount = gamma^n`` when no
terminal was met else 0, and the next state is the state after the latest step.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import numpy as np

from agent.model.arrays import Array

__all__ = ["NStepBuffer", "Replay", "Transitions"]


class Transitions(NamedTuple):
    """A batch of transitions (``[B]`` device arrays; ``agent``/``agent_next`` ``[B, K, 2]``)."""

    t: Array
    agent: Array
    action: Array
    reward: Array
    """float32 n-step discounted reward sum (normalised units)."""
    discount: Array
    """float32 ``gamma^n * (1 - done)``."""
    t_next: Array
    agent_next: Array


class NStepBuffer:
    """The last ``n`` lockstep steps of ``E`` environments; emits n-step transitions."""

    def __init__(
        self, n: int, gamma: float, *, n_envs: int, window: int, n_agent: int, xp: ModuleType
    ) -> None:
        self.n, self.gamma, self.xp = n, gamma, xp
        self.t = xp.zeros((n, n_envs), dtype=np.int64)
        self.agent = xp.zeros((n, n_envs, window, n_agent), dtype=np.float32)
        self.action = xp.zeros((n, n_envs), dtype=np.int64)
        self.reward = xp.zeros((n, n_envs), dtype=np.float32)
        self.done = xp.zeros((n, n_envs), dtype=bool)
        self.count = 0

    def clear(self) -> None:
        self.count = 0

    def push(
        self,
        before: tuple[Array, Array],
        action: Array,
        reward: Array,
        done: Array,
        after: tuple[Array, Array],
    ) -> Transitions | None:
        """Add one lockstep step: the state ``(t, agent)`` before it, the action, reward and done
        flags, and the state after it. Returns the ``E`` transitions that became complete, or None
        while fewer than ``n`` steps are buffered."""
        xp = self.xp
        t, agent = before
        t_next, agent_next = after
        slot = self.count % self.n
        self.t[slot], self.agent[slot], self.action[slot] = t, agent, action
        self.reward[slot], self.done[slot] = reward, done
        self.count += 1
        if self.count < self.n:
            return None
        order = [(self.count + k) % self.n for k in range(self.n)]  # oldest first
        rewards = self.reward[order]
        dones = self.done[order].astype(np.float32)
        alive = xp.cumprod(xp.concatenate([xp.ones_like(dones[:1]), 1.0 - dones[:-1]]), axis=0)
        powers = xp.asarray(self.gamma ** np.arange(self.n), dtype=np.float32)[:, None]
        ret = (powers * alive * rewards).sum(axis=0)
        ended = (alive[-1] * (1.0 - dones[-1])) == 0.0
        discount = xp.where(ended, np.float32(0.0), np.float32(self.gamma**self.n))
        first = order[0]
        return Transitions(
            self.t[first].copy(),
            self.agent[first].copy(),
            self.action[first].copy(),
            ret.astype(np.float32),
            discount.astype(np.float32),
            t_next,
            agent_next,
        )


class Replay:
    """Uniform replay memory of fixed capacity on the device (oldest overwritten first)."""

    def __init__(self, capacity: int, window: int, n_agent: int, xp: ModuleType) -> None:
        self.capacity, self.xp = capacity, xp
        self.t = xp.zeros(capacity, dtype=np.int64)
        self.agent = xp.zeros((capacity, window, n_agent), dtype=np.float32)
        self.action = xp.zeros(capacity, dtype=np.int64)
        self.reward = xp.zeros(capacity, dtype=np.float32)
        self.discount = xp.zeros(capacity, dtype=np.float32)
        self.t_next = xp.zeros(capacity, dtype=np.int64)
        self.agent_next = xp.zeros((capacity, window, n_agent), dtype=np.float32)
        self.size = 0
        self._head = 0

    def add(self, tr: Transitions) -> None:
        """Append a batch of transitions."""
        n = int(tr.t.shape[0])
        idx = self.xp.asarray((self._head + np.arange(n)) % self.capacity)
        self.t[idx], self.agent[idx], self.action[idx] = tr.t, tr.agent, tr.action
        self.reward[idx], self.discount[idx] = tr.reward, tr.discount
        self.t_next[idx], self.agent_next[idx] = tr.t_next, tr.agent_next
        self._head = (self._head + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, rng: np.random.Generator, batch: int) -> Transitions:
        """``batch`` transitions drawn uniformly with replacement (host generator: reproducible)."""
        idx = self.xp.asarray(rng.integers(0, self.size, batch))
        return Transitions(
            self.t[idx],
            self.agent[idx],
            self.action[idx],
            self.reward[idx],
            self.discount[idx],
            self.t_next[idx],
            self.agent_next[idx],
        )
