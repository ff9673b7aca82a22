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
        self.live = xp.zeros((n, n_envs), dtype=np.float32)
        """1.0 where the step was not terminal, else 0.0."""
        self.count = 0
        self._oldest_first = [xp.asarray([(slot + 1 + k) % n for k in range(n)]) for slot in range(n)]
        """Per slot just written, the slots oldest first."""
        self._alive = xp.ones((n + 1, n_envs), dtype=np.float32)
        """Row ``k``: 1.0 where none of the window's first ``k`` steps was terminal (row 0 stays 1)."""
        self._powers = xp.asarray(gamma ** np.arange(n), dtype=np.float32)[:, None]
        self._discount = np.float32(gamma**n)

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
        self.t[slot], self.agent[slot], self.action[slot], self.reward[slot] = t, agent, action, reward
        xp.logical_not(done, out=self.live[slot])
        self.count += 1
        if self.count < self.n:
            return None
        order = self._oldest_first[slot]
        rewards = self.reward.take(order, axis=0)
        live = self.live.take(order, axis=0)
        alive = self._alive
        for k in range(self.n):
            xp.multiply(alive[k], live[k], out=alive[k + 1])
        ret = (self._powers * alive[: self.n] * rewards).sum(axis=0)
        discount = alive[self.n] * self._discount  # 0 where a terminal was met
        first = (slot + 1) % self.n
        return Transitions(
            self.t[first].copy(),
            self.agent[first].copy(),
            self.action[first].copy(),
            ret,
            discount,
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
        idx: slice | Array = slice(self._head, self._head + n)
        if self._head + n > self.capacity:
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
            self.t.take(idx),
            self.agent.take(idx, axis=0),
            self.action.take(idx),
            self.reward.take(idx),
            self.discount.take(idx),
            self.t_next.take(idx),
            self.agent_next.take(idx, axis=0),
        )
