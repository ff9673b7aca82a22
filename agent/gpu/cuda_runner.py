"""The CUDA path of the inference engine: fused kernels replayed as CUDA graphs.

Per decision batch of B rows padded to a bucket b in (1, 2, 4, ..., max_batch), one graph
runs six kernels on the engine's stream:

    window_push -> mamba_forward -> softmax_ev (C51) -> softmax_ev (return head) -> thompson -> kelly

Inputs (feature rows, slots, health, positions, regime scale, decision indices) and outputs
(actions, targets, Q, return moments, Kelly fraction and size) live in pinned mapped host
memory (:mod:`agent.gpu.pinned`) that the kernels read and write directly; windows,
parameters and intermediate logits/probabilities stay on the device. Padded rows carry slot
-1, which every kernel skips. A call writes the inputs, launches the bucket's graph and
synchronises the stream once.

A model's buffer set (packed parameters, supports, scratch and its graphs) is built by
:meth:`CudaRunner.prepare` on a private stream (graph capture in relaxed mode), so a hot swap
can be prepared while decisions run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from agent.gpu.errors import InferenceError
from agent.gpu.pinned import MappedArray, mapped_empty
from agent.gpu.runner import Batch, RawDecision
from agent.kernels.kelly import kelly_launch
from agent.kernels.loader import cupy
from agent.kernels.mamba_forward import mamba_forward, pack_params
from agent.kernels.softmax_ev import softmax_ev
from agent.kernels.thompson import thompson
from agent.kernels.window_push import window_push
from agent.model.checkpoint import Checkpoint
from agent.model.config import ModelConfig
from agent.model.heads import ACTIONS, c51_support, return_bin_centres
from agent.policy.config import PolicyConfig

__all__ = ["CudaRunner", "batch_buckets"]

N_ACTIONS = len(ACTIONS)
LATENCY_BUCKET = 64
"""Buckets up to this size run the fused forward's latency variant (more threads a window).
Measured on the H200: one window 51.6 us with 512 threads vs 53.5 us with 256; 4096 windows
956 us vs 743 us."""
LATENCY_THREADS, THROUGHPUT_THREADS = 512, 256


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Graph bucket sizes: powers of two below ``max_batch``, then ``max_batch`` itself."""
    sizes = []
    b = 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(max_batch)
    return tuple(sizes)


@dataclass(frozen=True, slots=True)
class _IO:
    """Device views of a decision's inputs and outputs (B = max_batch rows)."""

    rows: Any  # (B, F) float32 raw feature rows
    slots: Any  # (B,) int32, -1 = padded row
    push: Any  # (B,) uint8 healthy and finite
    tradable: Any  # (B,) uint8
    positions: Any  # (B,) int32
    regime: Any  # (B,) float32
    steps: Any  # (B,) uint64
    push_valid: Any  # (B,) uint8 window push's own validity flags
    action: Any  # (B,) int32
    target: Any  # (B,) int32
    q: Any  # (B, A) float32
    ret_mean: Any  # (B,) float32
    ret_var: Any  # (B,) float32
    f_star: Any  # (B,) float64
    size: Any  # (B,) float64
    mean_return: Any  # (B,) float64
    host: dict[str, npt.NDArray[Any]]
    """NumPy views of the same bytes (empty for device-only scratch)."""

    @staticmethod
    def _specs(rows: int, n_features: int) -> dict[str, tuple[tuple[int, ...], npt.DTypeLike]]:
        return {
            "rows": ((rows, n_features), np.float32),
            "slots": ((rows,), np.int32),
            "push": ((rows,), np.uint8),
            "tradable": ((rows,), np.uint8),
            "positions": ((rows,), np.int32),
            "regime": ((rows,), np.float32),
            "steps": ((rows,), np.uint64),
            "push_valid": ((rows,), np.uint8),
            "action": ((rows,), np.int32),
            "target": ((rows,), np.int32),
            "q": ((rows, N_ACTIONS), np.float32),
            "ret_mean": ((rows,), np.float32),
            "ret_var": ((rows,), np.float32),
            "f_star": ((rows,), np.float64),
            "size": ((rows,), np.float64),
            "mean_return": ((rows,), np.float64),
        }

    @classmethod
    def mapped(cls, rows: int, n_features: int) -> _IO:
        """Every array in pinned mapped host memory; inputs zeroed, every slot padded."""
        arrays = {
            name: mapped_empty(shape, dtype) for name, (shape, dtype) in cls._specs(rows, n_features).items()
        }
        for buf in arrays.values():
            buf.host[...] = 0
        arrays["slots"].host[...] = -1
        views = {name: buf.device for name, buf in arrays.items()}
        return cls(
            **views, host={name: buf.host for name, buf in arrays.items()}, owners=tuple(arrays.values())
        )

    @classmethod
    def scratch(cls, cp: Any, rows: int, n_features: int) -> _IO:
        """Device-only arrays with every slot padded (kernel warm-up that changes nothing)."""
        views = {
            name: cp.zeros(shape, dtype=dtype)
            for name, (shape, dtype) in cls._specs(rows, n_features).items()
        }
        views["slots"][...] = -1
        return cls(**views, host={}, owners=())

    owners: tuple[MappedArray, ...] = ()
    """Keeps the pinned allocations alive as long as the views."""


@dataclass(frozen=True, slots=True)
class _CudaModel:
    config: ModelConfig
    packed: Any
    support: Any  # (atoms,) float32
    centres32: Any  # (bins,) float32
    centres64: Any  # (bins,) float64
    q_logits: Any  # (max_batch, A * atoms)
    ret_logits: Any  # (max_batch, bins)
    q_probs: Any  # (max_batch * A, atoms)
    q_var: Any  # (max_batch * A,), unused output of the C51 moments
    ret_probs: Any  # (max_batch, bins)
    values: Any  # (max_batch, A) Thompson draws
    graphs: dict[int, Any]


class CudaRunner:
    """Device windows, pinned mapped I/O and per-model graph sets for one engine."""

    def __init__(
        self,
        window: int,
        n_features: int,
        tick_values: npt.NDArray[np.float64],
        policy: PolicyConfig,
        max_batch: int,
    ) -> None:
        self._cp = cp = cupy()
        self.policy = policy
        self.max_batch = max_batch
        self.buckets = batch_buckets(max_batch)
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            self.window = cp.zeros((tick_values.size, window, n_features), dtype=cp.float32)
            self.tick_value = cp.asarray(tick_values, dtype=cp.float64)
        self.stream.synchronize()
        self.io = _IO.mapped(max_batch, n_features)
        self._open = True

    def prepare(self, checkpoint: Checkpoint) -> object:
        cp = self._cp
        cfg = checkpoint.config
        m = self.max_batch
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            packed = cp.asarray(
                pack_params(checkpoint.params, cfg, checkpoint.norm_mean, checkpoint.norm_std)
            )
            model = _CudaModel(
                config=cfg,
                packed=packed,
                support=c51_support(cfg, cp),
                centres32=return_bin_centres(cfg, cp),
                centres64=return_bin_centres(cfg, cp, np.float64),
                q_logits=cp.zeros((m, cfg.n_actions * cfg.n_atoms), dtype=cp.float32),
                ret_logits=cp.zeros((m, cfg.return_bins), dtype=cp.float32),
                q_probs=cp.zeros((m * cfg.n_actions, cfg.n_atoms), dtype=cp.float32),
                q_var=cp.zeros(m * cfg.n_actions, dtype=cp.float32),
                ret_probs=cp.zeros((m, cfg.return_bins), dtype=cp.float32),
                values=cp.zeros((m, cfg.n_actions), dtype=cp.float32),
                graphs={},
            )
            # Compile and load every kernel outside capture: a launch with every row padded
            # (slot -1) on private scratch touches no shared state.
            self._enqueue(model, m, _IO.scratch(cp, m, cfg.n_features))
            stream.synchronize()
            for bucket in self.buckets:
                stream.begin_capture()  # CuPy's default mode is relaxed
                try:
                    self._enqueue(model, bucket, self.io)
                finally:
                    graph = stream.end_capture()
                model.graphs[bucket] = graph
        return model

    def _enqueue(self, model: _CudaModel, n: int, io: _IO) -> None:
        """Launch the decision kernels for rows [0, n) of ``io`` on the current stream."""
        cfg = model.config
        a, atoms = cfg.n_actions, cfg.n_atoms
        slots = io.slots[:n]
        window_push(self.window, io.rows[:n], slots, io.push[:n], valid=io.push_valid[:n])
        mamba_forward(
            model.packed,
            cfg,
            self.window,
            slots,
            q_logits=model.q_logits[:n],
            ret_logits=model.ret_logits[:n],
            threads=LATENCY_THREADS if n <= LATENCY_BUCKET else THROUGHPUT_THREADS,
        )
        softmax_ev(
            model.q_logits[:n].reshape(n * a, atoms),
            model.support,
            probs=model.q_probs[: n * a],
            mean=io.q[:n].reshape(n * a),
            var=model.q_var[: n * a],
        )
        softmax_ev(
            model.ret_logits[:n],
            model.centres32,
            probs=model.ret_probs[:n],
            mean=io.ret_mean[:n],
            var=io.ret_var[:n],
        )
        thompson(
            model.q_probs[: n * a].reshape(n, a, atoms),
            model.support,
            self.policy.seed,
            slots,
            io.steps[:n],
            action=io.action[:n],
            value=model.values[:n],
        )
        kelly_launch(
            model.ret_probs[:n],
            model.centres64,
            dir_src=io.action[:n],
            dir_offset=1,
            slots=slots,
            tick_value=self.tick_value,
            regime=io.regime[:n],
            valid=io.tradable[:n],
            positions=io.positions[:n],
            policy=self.policy,
            target=io.target[:n],
            size=io.size[:n],
            f_star=io.f_star[:n],
            mean_return=io.mean_return[:n],
        )

    def run(self, model: object, batch: Batch) -> RawDecision:
        if not self._open:
            raise InferenceError("the engine is closed")
        cuda_model = cast(_CudaModel, model)
        n = batch.slots.size
        bucket = next(b for b in self.buckets if b >= n)
        host = self.io.host
        host["rows"][:n] = batch.features
        host["slots"][:n] = batch.slots
        host["slots"][n:bucket] = -1
        host["push"][:n] = batch.push
        host["tradable"][:n] = batch.tradable
        host["positions"][:n] = batch.positions
        host["regime"][:n] = batch.regime
        host["steps"][:n] = batch.steps
        cuda_model.graphs[bucket].launch(self.stream)
        self.stream.synchronize()
        return RawDecision(
            action=host["action"][:n].copy(),
            target=host["target"][:n].copy(),
            q=host["q"][:n].copy(),
            ret_mean=host["ret_mean"][:n].copy(),
            ret_var=host["ret_var"][:n].copy(),
            f_star=host["f_star"][:n].copy(),
            size=host["size"][:n].copy(),
        )

    def release(self) -> None:
        if self._open:
            self._open = False  # closed even when the synchronisation below fails
            self.stream.synchronize()
