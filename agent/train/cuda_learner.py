"""The learner on a CUDA device: one update is one CUDA graph of the fused training kernels
(:mod:`agent.kernels.train`), with no host synchronisation; acting is one kernel.

What stays on the host: the environments, the n-step buffer and replay (NumPy, in lockstep; the
trainer's data is small and the host steps 64 environments in tens of microseconds), and the
sampling of each batch. What moves to the device: the fold's normalised market features (once a
fold), the parameters (the packed buffer of :func:`agent.kernels.mamba_forward.pack_params`, the
engine's layout), the target network, Adam's moments and everything an update computes.

Per update the host writes the sampled batch into pinned, mapped memory and launches the batch
size's graph; the kernels read the batch where it lies. Two such input sets alternate, each
guarded by an event, so that the host stages the next batch while the device trains on the last.
Losses, gradient norms and skips go to a ring on the device that :meth:`CudaLearner.take_stats`
reads once an epoch. Acting writes the environments' decision bars and agent histories into
pinned memory, launches the act kernel and waits once: the lockstep step's one synchronisation.

The arithmetic is :class:`agent.train.learner.Learner`'s (tests/gpu/test_train_kernels.py holds
the two together).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from agent.gpu.pinned import MappedArray, mapped_empty
from agent.kernels.loader import cupy, kernel
from agent.kernels.mamba_forward import THROUGHPUT, mamba_forward
from agent.kernels.train import (
    COUNTERS,
    INPUTS,
    STATS_DTYPE,
    FusedUpdate,
    UpdateSettings,
    input_shape,
    pack_train,
    train_layout,
    unpack_params,
)
from agent.model import ModelConfig
from agent.model.arrays import Array, Params, to_numpy
from agent.policy.observation import AGENT_FEATURES
from agent.policy.philox import Purpose
from agent.train.config import TrainConfig
from agent.train.env import EnvData
from agent.train.learner import EpochStats, Learner
from agent.train.replay import Transitions

__all__ = ["CudaLearner", "fused_fits", "select_learner"]

log = logging.getLogger(__name__)

_TARGET_MODES = {"none": 0, "polyak": 1, "hard": 2}


def fused_fits(model: ModelConfig) -> bool:
    """Whether the fused kernels can train ``model`` (a window's working set in the per-window
    kernels fits a block's shared memory); otherwise the generic array code trains it on the
    device."""
    return train_layout(model).fits


class CudaLearner:
    """Online and target networks, Adam and the acting rules on the current CUDA device, with
    the interface of :class:`agent.train.learner.Learner` (environments on the host)."""

    xp = np
    """The environments' array module: the host's."""

    def __init__(self, model: ModelConfig, config: TrainConfig, params: Params, *, seed: int) -> None:
        self.model, self.config, self.seed = model, config, seed
        cp = self._cp = cupy()
        self._options = train_layout(model).options
        self.stream = cp.cuda.Stream(non_blocking=True)
        batch = config.batch_size
        self._io: list[dict[str, MappedArray]] = [
            {
                name: mapped_empty(input_shape(name, batch, model), dtype)
                for name, (_, dtype) in INPUTS.items()
            }
            for _ in range(2)
        ]
        for io in self._io:
            for buf in io.values():
                buf.host[...] = 0
        settings = UpdateSettings(
            lr=config.lr,
            eps=config.adam_eps,
            max_norm=config.grad_clip,
            target_mode=_TARGET_MODES[config.target_update],
            rho=config.polyak_rho,
            hard_every=config.hard_sync_every,
            ret_weight=config.return_loss_weight,
            munchausen=config.munchausen,
            m_alpha=config.munchausen_alpha,
            m_tau=config.munchausen_tau,
            m_clip=config.munchausen_clip,
        )
        ring = max(1024, math.ceil(config.steps_per_epoch * config.updates_per_step) + 1)
        host_params = {name: to_numpy(p) for name, p in params.items()}
        with self.stream:
            self.fused = FusedUpdate(
                model,
                settings,
                xp=cp,
                get=self._get,
                packed=pack_train(host_params, model),
                inputs={name: buf.device for name, buf in self._io[0].items()},
                ring_size=ring,
            )
        n_envs, n_agent = config.n_envs, len(AGENT_FEATURES)
        self._act_in = {
            "t": mapped_empty((n_envs,), np.int64),
            "agent": mapped_empty((n_envs, model.window, n_agent), np.float32),
            "step": mapped_empty((n_envs,), np.uint64),
            "action": mapped_empty((n_envs,), np.int32),
            "q": mapped_empty((n_envs, model.n_actions), np.float32),
        }
        self._graphs: dict[int, Any] = {}
        """Update graphs by input set."""
        self._act_graphs: dict[int, Any] = {}
        """Acting graphs by number of environments."""
        self._done = [cp.cuda.Event(), cp.cuda.Event()]
        self._next = 0
        self._data: EnvData | None = None
        self._ring_read = 0
        self._skipped_read = 0
        self.stream.synchronize()

    def _get(self, name: str) -> Any:
        return kernel("train.cu", name, options=self._options)

    # parameters ---------------------------------------------------------------------------------

    def host_params(self) -> Params:
        """The online network's parameters as a host dict (a copy)."""
        self.stream.synchronize()
        return unpack_params(cupy().asnumpy(self.fused.params), self.model)

    def reset_optimizer(self) -> None:
        """Fresh Adam moments and a target network synced to the online one (each fold)."""
        with self.stream:
            self.fused.reset_optimizer()

    # data ---------------------------------------------------------------------------------------

    def _use(self, data: EnvData) -> None:
        """Put ``data``'s market features on the device (the graphs read them: recaptured)."""
        if data is self._data:
            return
        if data.xp is not np:
            raise TypeError("CudaLearner trains on host environments (EnvData built with NumPy)")
        self.stream.synchronize()
        with self.stream:
            self.fused.feat = self._cp.asarray(data.feat, dtype=np.float32)
        self._graphs.clear()
        self._act_graphs.clear()
        self._data = data

    # acting -------------------------------------------------------------------------------------

    def _forward_q(self, obs: Array) -> Any:
        """Expected Q (B, A) on the device for host windows ``obs`` (B, K, F)."""
        cp, cfg = self._cp, self.model
        rows = int(obs.shape[0])
        with self.stream:
            window = cp.asarray(obs, dtype=cp.float32)
            q_logits, _ = mamba_forward(
                self.fused.params, cfg, window, cp.arange(rows, dtype=cp.int32), variant=THROUGHPUT
            )
            logits = q_logits.reshape(rows, cfg.n_actions, cfg.n_atoms)
            e = cp.exp(logits - logits.max(axis=2, keepdims=True))
            probs = e / e.sum(axis=2, keepdims=True)
            q = (probs * self.fused.support).sum(axis=2)
        return q

    def q_values(self, obs: Array) -> Any:
        """Expected Q ``[B, A]`` (normalised units) of host windows ``[B, K, F + 2]``."""
        q = self._forward_q(obs)
        self.stream.synchronize()
        return q

    def greedy(self, obs: Array) -> Array:
        """Argmax of expected Q (ties to the lowest action), ``[B]`` int64 on the host."""
        q = self._forward_q(obs)
        with self.stream:
            best = self._cp.argmax(q, axis=1)
        return best.get(stream=self.stream).astype(np.int64)

    def explore(self, data: EnvData, t: Array, agent: Array, env: Array, step: Array) -> Array:
        """Thompson actions ``[E]`` (host int64) for environments ``env`` (0 .. E-1, in order)
        at decision bars ``t`` with agent histories ``agent``, keyed by ``step``."""
        self._use(data)
        n = int(t.shape[0])
        io = self._act_in
        if n > io["t"].host.shape[0] or not np.array_equal(np.asarray(env), np.arange(n)):
            raise ValueError("CudaLearner.explore acts for environments 0 .. n_envs - 1 in order")
        io["t"].host[:n] = t
        io["agent"].host[:n] = agent
        io["step"].host[:n] = step
        graph = self._act_graphs.get(n)
        if graph is None:
            graph = self._capture_act(n)
        graph.launch(self.stream)
        self.stream.synchronize()
        return io["action"].host[:n].astype(np.int64)

    def _capture_act(self, n: int) -> Any:
        """The acting launch for ``n`` environments as a graph (replayed each lockstep step:
        a graph launch costs the host a fraction of a kernel launch with its arguments)."""
        io = self._act_in
        self.stream.synchronize()
        with self.stream:
            self.stream.begin_capture()
            try:
                self.fused.act(
                    io["t"].device[:n],
                    io["agent"].device[:n],
                    io["step"].device[:n],
                    seed=self.seed,
                    purpose=int(Purpose.THOMPSON),
                    greedy=False,
                    action=io["action"].device[:n],
                    q=io["q"].device[:n],
                )
            finally:
                graph = self.stream.end_capture()
        self._act_graphs[n] = graph
        return graph

    # learning -----------------------------------------------------------------------------------

    def update(self, data: EnvData, batch: Transitions) -> None:
        """Stage ``batch`` and launch one update (asynchronous; see :meth:`take_stats`)."""
        self._use(data)
        slot = self._next
        self._next ^= 1
        self._done[slot].synchronize()  # the device has read this input set's last batch
        io = self._io[slot]
        io["t_obs"].host[...] = batch.t
        io["agent_obs"].host[...] = batch.agent
        io["t_next"].host[...] = batch.t_next
        io["agent_next"].host[...] = batch.agent_next
        io["action"].host[...] = batch.action
        io["reward"].host[...] = batch.reward
        io["discount"].host[...] = batch.discount
        io["label"].host[...] = data.label_ticks[np.asarray(batch.t)]
        graph = self._graphs.get(slot)
        if graph is None:
            graph = self._capture(slot)
        graph.launch(self.stream)
        self._done[slot].record(self.stream)

    def _capture(self, slot: int) -> Any:
        self.fused.inputs = {name: buf.device for name, buf in self._io[slot].items()}
        self.stream.synchronize()
        with self.stream:
            self.stream.begin_capture()
            try:
                self.fused.enqueue()
            finally:
                graph = self.stream.end_capture()
        self._graphs[slot] = graph
        return graph

    def take_stats(self) -> EpochStats:
        """Means of the losses and finite gradient norms of the updates since the last call,
        with the counts (one device synchronisation)."""
        self.stream.synchronize()
        cp = self._cp
        counters = dict(zip(COUNTERS, cp.asnumpy(self.fused.counters).tolist(), strict=True))
        ring = cp.asnumpy(self.fused.ring).view(STATS_DTYPE).reshape(-1)
        written = counters["ring"]
        first = max(self._ring_read, written - self.fused.ring_size)
        records = ring[[i % self.fused.ring_size for i in range(first, written)]]
        self._ring_read = written
        skipped = counters["skipped"] - self._skipped_read
        self._skipped_read = counters["skipped"]
        return EpochStats.of(
            records["c51_loss"],
            records["ret_loss"],
            records["grad_norm"],
            updates=counters["updates"],
            skipped=skipped,
        )

    @property
    def updates(self) -> int:
        self.stream.synchronize()
        return int(self.fused.counters[COUNTERS.index("updates")].get())

    def synchronize(self) -> None:
        """Wait for every launched update (benchmarks)."""
        self.stream.synchronize()


def select_learner(
    model: ModelConfig, config: TrainConfig, params: Params, *, seed: int, cuda: bool
) -> Learner | CudaLearner:
    """The learner for a run: the fused :class:`CudaLearner` on a CUDA device when the model
    fits its kernels, else the array-code :class:`Learner` on ``params``' device (logged)."""
    if cuda and fused_fits(model):
        return CudaLearner(model, config, params, seed=seed)
    if cuda:
        log.warning(
            "the model's per-window working set (%d KiB) exceeds a block's shared memory: training "
            "with the array code on the device, not the fused kernels",
            max(train_layout(model).shared.values()) // 1024,
        )
    return Learner(model, config, params, seed=seed)
