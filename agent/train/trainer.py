"""Training on one fold: explore, store, learn, and check Q-drift after every epoch.

An epoch is ``steps_per_epoch`` lockstep steps of ``n_envs`` training environments (each step
adds ``n_envs`` n-step transitions to replay) with ``updates_per_step`` learner updates per step
once replay holds ``learning_starts`` transitions. A step's updates are launched right after its
actions are chosen and sample replay as it stood before the step, so that on a device they run
while the host steps the environments. After each epoch the probe statistics are
measured on fixed windows of the training data with a flat agent state, and two halts decide
whether training goes on (:mod:`agent.train.gates`): the share of the epoch's updates skipped for a
non-finite gradient, and Q-drift (from the fold's second epoch, against the previous epoch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import msgspec
import numpy as np

from agent.model import ACTIONS
from agent.model.arrays import Array, to_numpy
from agent.policy.observation import AGENT_FEATURES
from agent.train.config import TrainConfig
from agent.train.env import EnvData, VecEnv
from agent.train.errors import TrainTimeout
from agent.train.gates import GateEvent, action_entropy, drift_floor, nonfinite_gradients, q_drift
from agent.train.learner import TrainingLearner
from agent.train.replay import NStepBuffer, Replay

__all__ = ["EpochRecord", "FoldTraining", "Probe", "ProbeStats", "make_probe", "probe_stats", "train_fold"]

_STEP_STRIDE = 1 << 40
"""Philox step offset between folds: every (fold, step) has its own counter."""


class EpochRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Learning-curve point of one epoch (host numbers)."""

    fold: int
    epoch: int
    q_mean: float
    q_spread: float
    entropy: float
    c51_loss: float
    return_loss: float
    grad_norm: float
    reward_mean: float
    """Mean normalised reward of the exploring environments during the epoch."""
    explore_mix: list[float]
    """Fractions of short, flat, long among the effective exploration actions."""
    updates: int
    skipped: int = 0
    """Updates of the epoch skipped because their gradient was not finite."""


class Probe(NamedTuple):
    """Fixed probe windows: decision bars of the training data with a flat agent history."""

    t: Array
    agent: Array


class ProbeStats(NamedTuple):
    q_mean: float
    """Mean expected Q over probe windows and actions."""
    q_spread: float
    """Mean over probe windows of max_a Q - min_a Q."""
    greedy_mix: list[float]
    entropy: float


class FoldTraining(NamedTuple):
    epochs: list[EpochRecord]
    drift_events: list[GateEvent]
    """The halt gates' events, per epoch ``nonfinite_gradients`` then ``q_drift``; when
    ``halted``, the last one is the failure."""
    q_initial: float
    """Probe Q-mean before the fold's training."""
    halted: bool

    def early_q_move(self, early_epochs: int) -> float:
        """Largest move of the probe Q-mean from :attr:`q_initial` within the fold's first
        ``early_epochs`` epochs (the kill criterion ``kill_early_q_move``)."""
        return max((abs(e.q_mean - self.q_initial) for e in self.epochs[:early_epochs]), default=0.0)


def make_probe(data: EnvData, size: int) -> Probe:
    """``size`` decision bars evenly spread over ``data`` (fewer if it has fewer)."""
    xp = data.xp
    starts = to_numpy(data.starts)
    pick = starts[np.unique(np.linspace(0, starts.shape[0] - 1, size).astype(np.int64))]
    t = xp.asarray(pick)
    return Probe(t, xp.zeros((pick.shape[0], data.window, len(AGENT_FEATURES)), dtype=np.float32))


def probe_stats(learner: TrainingLearner, data: EnvData, probe: Probe) -> ProbeStats:
    """Q-mean, Q-spread and greedy action mix of the learner on the probe windows."""
    q = to_numpy(learner.q_values(data.windows(probe.t, probe.agent))).astype(np.float64)
    greedy = np.argmax(q, axis=1)
    mix = [float(np.mean(greedy == a)) for a in range(len(ACTIONS))]
    spread = float(np.mean(q.max(axis=1) - q.min(axis=1))) if q.size else 0.0
    return ProbeStats(float(np.mean(q)) if q.size else 0.0, spread, mix, action_entropy(mix))


def train_fold(
    learner: TrainingLearner,
    data: EnvData,
    config: TrainConfig,
    *,
    fold: int,
    seed: int,
    deadline: float | None = None,
    on_step: Callable[[], None] | None = None,
) -> FoldTraining:
    """Train ``learner`` on ``data`` for ``config.epochs`` epochs (fresh replay and optimiser);
    stop early when a halt gate fails (non-finite gradients, Q-drift). ``deadline``
    (``time.monotonic()`` seconds) raises :class:`TrainTimeout` between steps; ``on_step`` is
    called after every lockstep step."""
    xp, cfg = data.xp, config
    rng = np.random.default_rng([seed, fold])
    env = VecEnv(data, cfg.n_envs, reward_scale=cfg.reward_scale, seed=int(rng.integers(2**63)))
    env.reset_random()
    n_agent = len(AGENT_FEATURES)
    nstep = NStepBuffer(cfg.n_step, cfg.gamma, n_envs=cfg.n_envs, window=data.window, n_agent=n_agent, xp=xp)
    replay = Replay(cfg.replay_capacity, data.window, n_agent, xp)
    learner.reset_optimizer()
    probe = make_probe(data, cfg.probe_size)
    q_initial = probe_stats(learner, data, probe).q_mean
    q_prev: float | None = None  # the fold's first epoch is compared with nothing
    floor = drift_floor(learner.model, cfg)
    env_ids = xp.arange(cfg.n_envs, dtype=np.int64)
    epochs: list[EpochRecord] = []
    drift: list[GateEvent] = []
    step = 0
    credit = 0.0
    learner.take_stats()  # what came before this fold is not this fold's first epoch
    taken = np.zeros((cfg.steps_per_epoch, cfg.n_envs), dtype=np.int64)  # the epoch's effective actions
    for epoch in range(cfg.epochs):
        reward_sum = 0.0
        for k in range(cfg.steps_per_epoch):
            if deadline is not None and time.monotonic() > deadline:
                raise TrainTimeout("the time limit was reached during training")
            before = (env.t, env.agent)  # the environment replaces its state arrays, never writes them
            counter = xp.full(cfg.n_envs, fold * _STEP_STRIDE + step, dtype=np.int64)
            actions = learner.explore(data, env.t, env.agent, env_ids, counter)
            # The step's updates before the environments move: on a device they run while the
            # host steps the environments (they sample replay as it stood before this step).
            credit += cfg.updates_per_step
            while credit >= 1.0:
                credit -= 1.0
                if replay.size >= max(cfg.learning_starts, cfg.batch_size):
                    learner.update(data, replay.sample(rng, cfg.batch_size))
            res = env.step(actions)
            step += 1
            batch = nstep.push(before, res.action, res.reward, res.done, (env.t, env.agent))
            if batch is not None:
                replay.add(batch)
            if int(xp.count_nonzero(res.done)):
                env.reset_random(res.done)
            reward_sum += float(res.reward.sum())
            taken[k] = to_numpy(res.action)
            if on_step is not None:
                on_step()
        counts = np.bincount(taken.ravel(), minlength=len(ACTIONS)).astype(np.float64)
        learned = learner.take_stats()
        stats = probe_stats(learner, data, probe)
        epochs.append(
            EpochRecord(
                fold=fold,
                epoch=epoch,
                q_mean=stats.q_mean,
                q_spread=stats.q_spread,
                entropy=stats.entropy,
                c51_loss=learned.c51_loss,
                return_loss=learned.return_loss,
                grad_norm=learned.grad_norm,
                reward_mean=reward_sum / (cfg.steps_per_epoch * cfg.n_envs),
                explore_mix=(counts / max(counts.sum(), 1.0)).tolist(),
                updates=learned.updates,
                skipped=learned.skipped,
            )
        )
        for event in (
            nonfinite_gradients(learned.skipped, learned.attempts, cfg, fold_index=fold, epoch=epoch),
            q_drift(stats.q_mean, q_prev, floor, cfg, fold_index=fold, epoch=epoch),
        ):
            drift.append(event)
            if not event.passed:
                return FoldTraining(epochs, drift, q_initial, halted=True)
        q_prev = stats.q_mean
    return FoldTraining(epochs, drift, q_initial, halted=False)
