"""The C51 learner (ALGORITHMS section 2): double-DQN targets, n-step returns, a target network,
Adam with global-norm clipping, Thompson exploration, and the return head trained alongside.

One update on a batch of transitions (:class:`agent.train.replay.Transitions`):

1. online forward on ``s`` -> C51 logits and return-head logits;
2. double DQN: ``a* = argmax_a Q_online(s', a)``, target distribution ``p_target(s', a*)``
   (``target_update = "none"``: the online network is its own target), or the Munchausen
   mixture (below);
3. ``m = project(R + discount * z)``; loss = cross-entropy of ``p(s, a)`` against ``m``;
4. return head: cross-entropy against the bin of the realised ``return_horizon``-bar mark change
   in ticks at ``s`` (rows without a label inside the session do not contribute);
5. backward, clip the global gradient norm, Adam; then Polyak averaging or a hard copy every
   ``hard_sync_every`` updates (weights only, never optimiser state).

Exploration: Thompson sampling from the online distributions, one Philox uniform per action keyed
by (seed, environment, step) (:mod:`agent.policy.thompson`; the CUDA kernel on the GPU), so a run
is reproducible on the CPU for a seed.

Munchausen (``train.munchausen``, off by default; ALGORITHMS 2): the target becomes the
pi(.|s')-mixture of the target network's next-state distributions with the bonus
``alpha * clip(tau log pi(a|s), clip, 0)``, pi the softmax of the target network's mean Q over
tau (:func:`agent.model.losses.munchausen_project`); it replaces the double-DQN argmax.

This class is the array-code learner (NumPy, or CuPy for models too large for the fused kernels)
and the reference of :class:`agent.train.cuda_learner.CudaLearner`, which runs the same update as
one CUDA graph. Both report per epoch through :meth:`Learner.take_stats`.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple, Protocol

import numpy as np

from agent.kernels.thompson import thompson
from agent.model import ModelConfig, c51_support, expected_q, forward, q_probs, return_bin_of
from agent.model.arrays import Array, Params, array_module, to_numpy
from agent.model.errors import NonFiniteError
from agent.model.losses import c51_loss_and_grad, c51_project, munchausen_project, return_loss_and_grad
from agent.model.network import backward
from agent.model.optim import Adam, clip_grad_norm
from agent.policy.thompson import thompson_ref
from agent.train.config import TrainConfig
from agent.train.env import EnvData
from agent.train.replay import Transitions

__all__ = ["EpochStats", "Learner", "TrainingLearner", "UpdateStats"]


class UpdateStats(NamedTuple):
    """Scalars of one update (host floats)."""

    c51_loss: float
    return_loss: float
    grad_norm: float


class EpochStats(NamedTuple):
    """What a learner did since its last :meth:`Learner.take_stats` (host numbers)."""

    c51_loss: float
    """Mean C51 loss of the updates (NaN when there were none)."""
    return_loss: float
    grad_norm: float
    """Mean of the finite gradient norms (NaN when none was finite)."""
    attempts: int
    """Updates attempted (applied + skipped)."""
    updates: int
    """Updates applied since the learner was made (all folds)."""
    skipped: int
    """Updates skipped for a non-finite gradient since the last call."""

    @classmethod
    def of(
        cls, c51: np.ndarray, ret: np.ndarray, norm: np.ndarray, *, updates: int, skipped: int
    ) -> EpochStats:
        finite = norm[np.isfinite(norm)]
        nan = float("nan")
        return cls(
            c51_loss=float(np.mean(c51)) if c51.size else nan,
            return_loss=float(np.mean(ret)) if ret.size else nan,
            grad_norm=float(np.mean(finite)) if finite.size else nan,
            attempts=int(c51.size),
            updates=updates,
            skipped=skipped,
        )


class TrainingLearner(Protocol):
    """What the trainer asks of a learner (:class:`Learner`, or the fused
    :class:`agent.train.cuda_learner.CudaLearner`)."""

    @property
    def model(self) -> ModelConfig: ...

    @property
    def xp(self) -> ModuleType:
        """The array module of the environments it acts in."""

    def host_params(self) -> Params: ...

    def reset_optimizer(self) -> None: ...

    def q_values(self, obs: Array) -> Array: ...

    def greedy(self, obs: Array) -> Array: ...

    def explore(self, data: EnvData, t: Array, agent: Array, env: Array, step: Array) -> Array: ...

    def update(self, data: EnvData, batch: Transitions) -> object: ...

    def take_stats(self) -> EpochStats: ...


class Learner:
    """Online and target parameters, the optimiser and the acting rules, on one device."""

    def __init__(self, model: ModelConfig, config: TrainConfig, params: Params, *, seed: int) -> None:
        xp = array_module(*params.values())
        self.model, self.config, self.xp, self.seed = model, config, xp, seed
        self.params = params
        self.target: Params = params if config.target_update == "none" else _copy(params)
        self.optimizer = Adam(params, lr=config.lr, eps=config.adam_eps)
        self.support = c51_support(model, xp)
        self.updates = 0
        self.skipped = 0
        """Updates rejected because the gradient was not finite."""
        self._stats: list[UpdateStats] = []
        self._skipped_read = 0

    def host_params(self) -> Params:
        """The online network's parameters as host arrays (NumPy: the live arrays themselves)."""
        return {name: to_numpy(p) for name, p in self.params.items()}

    def take_stats(self) -> EpochStats:
        """The updates since the last call: mean losses and gradient norm, counts."""
        arr = np.array(self._stats, dtype=np.float64).reshape(-1, 3)
        self._stats = []
        skipped = self.skipped - self._skipped_read
        self._skipped_read = self.skipped
        return EpochStats.of(arr[:, 0], arr[:, 1], arr[:, 2], updates=self.updates, skipped=skipped)

    def reset_optimizer(self) -> None:
        """Fresh Adam moments and a target network synced to the online one (each fold)."""
        self.optimizer = Adam(self.params, lr=self.config.lr, eps=self.config.adam_eps)
        if self.config.target_update != "none":
            self.target = _copy(self.params)

    # acting ----------------------------------------------------------------------------------

    def distributions(self, obs: Array, params: Params | None = None) -> Array:
        """C51 probabilities ``[B, A, atoms]`` for observations ``[B, K, F + 2]``."""
        q_logits, _, _ = forward(self.params if params is None else params, self.model, obs)
        return q_probs(q_logits)

    def q_values(self, obs: Array) -> Array:
        """Expected Q ``[B, A]`` (normalised units)."""
        return expected_q(self.distributions(obs), self.support)

    def greedy(self, obs: Array) -> Array:
        """Argmax of expected Q (ties to the lowest action), ``[B]`` int64."""
        return self.xp.argmax(self.q_values(obs), axis=1).astype(np.int64)

    def explore(self, data: EnvData, t: Array, agent: Array, env: Array, step: Array) -> Array:
        """Thompson actions ``[B]`` for environments ``env`` at decision bars ``t`` of ``data``
        with agent histories ``agent``, keyed by their step counters ``step``."""
        probs = self.distributions(data.windows(t, agent)).astype(np.float32)
        if self.xp is np:
            return thompson_ref(probs, self.support, self.seed, env, step).action.astype(np.int64)
        action, _ = thompson(
            probs, self.support.astype(np.float32), self.seed, env.astype(np.int32), step.astype(np.uint64)
        )
        return action.astype(np.int64)

    # learning --------------------------------------------------------------------------------

    def update(self, data: EnvData, batch: Transitions) -> UpdateStats:
        """One gradient step on ``batch``; a non-finite gradient skips the step (counted)."""
        xp, cfg = self.xp, self.config
        obs = data.windows(batch.t, batch.agent)
        nxt = data.windows(batch.t_next, batch.agent_next)
        q_logits, ret_logits, cache = forward(self.params, self.model, obs)
        rows = xp.arange(obs.shape[0])
        online_next = self.distributions(nxt)
        target_next = online_next if self.target is self.params else self.distributions(nxt, self.target)
        if cfg.munchausen:
            target_now = self.distributions(obs, self.target)
            m = munchausen_project(
                target_next,
                expected_q(target_next, self.support),
                expected_q(target_now, self.support),
                actions=batch.action,
                rewards=batch.reward,
                discounts=batch.discount,
                support=self.support,
                alpha=cfg.munchausen_alpha,
                tau=cfg.munchausen_tau,
                clip_low=cfg.munchausen_clip,
            ).astype(q_logits.dtype)
        else:
            a_star = xp.argmax(expected_q(online_next, self.support), axis=1)
            m = c51_project(target_next[rows, a_star], batch.reward, batch.discount, self.support)
        c51_loss, g_q = c51_loss_and_grad(q_logits, batch.action, m)
        label = data.label_ticks[batch.t]
        valid = xp.isfinite(label)
        n_valid = int(valid.sum())
        g_ret = xp.zeros_like(ret_logits)
        ret_loss = 0.0
        if n_valid and cfg.return_loss_weight > 0:
            bins = return_bin_of(label[valid], self.model)
            loss_r, g_r = return_loss_and_grad(ret_logits[valid], bins)
            g_ret[valid] = g_r * (cfg.return_loss_weight * n_valid / obs.shape[0])
            ret_loss = float(loss_r)
        grads, _ = backward(self.params, self.model, cache, g_q, g_ret)
        try:
            norm = clip_grad_norm(grads, cfg.grad_clip)
        except NonFiniteError:
            self.skipped += 1
            stats = UpdateStats(float(c51_loss), ret_loss, float("nan"))
        else:
            self.optimizer.update(self.params, grads)
            self.updates += 1
            self._sync_target()
            stats = UpdateStats(float(c51_loss), ret_loss, norm)
        self._stats.append(stats)
        return stats

    def _sync_target(self) -> None:
        cfg = self.config
        if cfg.target_update == "polyak":
            for name, p in self.params.items():
                t = self.target[name]
                t *= 1.0 - cfg.polyak_rho
                t += cfg.polyak_rho * p
        elif cfg.target_update == "hard" and self.updates % cfg.hard_sync_every == 0:
            for name, p in self.params.items():
                self.target[name][...] = p


def _copy(params: Params) -> Params:
    return {name: p.copy() for name, p in params.items()}
