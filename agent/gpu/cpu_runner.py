"""The CPU path of the inference engine: the model's NumPy forward and the policy references.

The same maths as the CUDA path, written once: the window push, C51/return-head moments,
Thompson and Kelly are the very ``*_ref`` functions the kernels are tested against.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from agent.gpu.errors import InferenceError
from agent.gpu.runner import Batch, Costs, RawDecision, column
from agent.kernels.softmax_ev import softmax_ev_ref
from agent.kernels.window_push import window_push_ref
from agent.model.checkpoint import Checkpoint
from agent.model.config import ModelConfig
from agent.model.heads import c51_support, return_bin_centres
from agent.model.network import forward
from agent.policy.config import PolicyConfig
from agent.policy.kelly import kelly_size_ref
from agent.policy.thompson import greedy_ref, thompson_ref

__all__ = ["CpuRunner"]

F32 = npt.NDArray[np.float32]

ROWS_PER_FORWARD = 32
"""Windows per model forward call: a larger batch is evaluated in slices of this many rows.
The activations of 32 windows (a few hundred kB) stay in a core's cache; one call over
thousands of rows streams multi-MB temporaries through memory and costs ~3x more per row
on the 2-core machine (README "bench infer"). Rows are independent, so slicing changes no
result beyond the BLAS kernel's rounding for another row count."""


def _weights(value: npt.ArrayLike) -> F32:
    """A float32 copy; matrices column-major, so that the model's ``x @ W.T`` sees a C-contiguous
    right operand: NumPy's stacked float32 matmul then takes the BLAS path (with a transposed
    C-order operand it falls back to a loop ~50x slower, 1.6 ms instead of 30 us for one
    (32, 64) x (64, 296) window on a 2-core machine)."""
    a = np.asarray(value, dtype=np.float32)
    return np.asfortranarray(a) if a.ndim == 2 else a.copy()


@dataclass(frozen=True, slots=True)
class _CpuModel:
    config: ModelConfig
    params: dict[str, F32]
    mean: F32
    std: F32
    support: F32
    centres: F32


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc ``mallopt`` parameters (malloc.h)."""


@functools.cache
def _keep_freed_heap() -> None:
    """Let glibc keep up to 16 MiB of freed heap for reuse instead of returning it at once.

    Every forward allocates the same few MB of temporaries and frees them. glibc's dynamic
    thresholds follow the largest block freed so far (a few hundred kB here): after each
    forward the heap's free top exceeds twice that and is trimmed, and the next forward faults
    every page back in, which costs ~30% of the forward at 32+ rows (measured 230 -> 140 us a
    row on the 2-core machine; no change at one row; 4 MiB is not enough, 16 MiB is). Blocks
    up to 32 MiB (glibc's dynamic ceiling) come from the heap, as in a process that has freed
    large arrays. Process-wide, so set once per process; at most 16 MiB more resident memory;
    nothing happens without glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 16 << 20)


def _forward_rows(model: _CpuModel, x: F32) -> tuple[F32, F32]:
    """The model's forward on windows x (B, K, F), in slices of :data:`ROWS_PER_FORWARD`."""
    parts = [
        forward(model.params, model.config, x[i : i + ROWS_PER_FORWARD])[:2]
        for i in range(0, x.shape[0], ROWS_PER_FORWARD)
    ]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([q for q, _ in parts]), np.concatenate([r for _, r in parts])


class CpuRunner:
    """Windows in a (slots, K, F) float32 array and per-slot counters; one model buffer set per
    checkpoint."""

    def __init__(
        self,
        window: int,
        n_features: int,
        tick_values: npt.NDArray[np.float64],
        policy: PolicyConfig,
        costs: Costs,
    ) -> None:
        self.window = np.zeros((tick_values.size, window, n_features), dtype=np.float32)
        self._bars = np.zeros(tick_values.size, dtype=np.int64)  # rows pushed
        self._steps = np.zeros(tick_values.size, dtype=np.uint64)  # decisions made
        self.tick_values = tick_values
        self.policy = policy
        self.costs = costs
        self._open = True
        _keep_freed_heap()

    def prepare(self, checkpoint: Checkpoint) -> object:
        cfg = checkpoint.config
        return _CpuModel(
            config=cfg,
            params={name: _weights(value) for name, value in checkpoint.params.items()},
            mean=np.array(checkpoint.norm_mean, dtype=np.float32),
            std=np.array(checkpoint.norm_std, dtype=np.float32),
            support=c51_support(cfg),
            centres=return_bin_centres(cfg),
        )

    def run(self, model: object, batch: Batch) -> RawDecision:
        if not self._open:
            raise InferenceError("the engine is closed")
        model = cast(_CpuModel, model)
        cfg = model.config
        slots = batch.slots
        n = slots.size
        positions = column(batch.positions, np.int32, n)
        regime = column(batch.regime, np.float32, n)
        healthy = column(batch.healthy, np.bool_, n)
        push = window_push_ref(self.window, batch.features, slots, healthy)
        tradable = push & (self._bars[slots] >= self.window.shape[1] - 1)
        steps = self._steps[slots]
        self._bars[slots] += push
        self._steps[slots] += np.uint64(1)
        x = (self.window[slots] - model.mean) / model.std
        q_logits, ret_logits = _forward_rows(model, x)
        q_probs, q, _ = softmax_ev_ref(q_logits.reshape(n * cfg.n_actions, cfg.n_atoms), model.support)
        r_probs, r_mean, r_var = softmax_ev_ref(ret_logits, model.centres)
        q = q.reshape(n, cfg.n_actions)
        if self.policy.selection == "greedy":
            action = greedy_ref(q)
        else:
            action = thompson_ref(
                q_probs.reshape(n, cfg.n_actions, cfg.n_atoms),
                model.support,
                self.policy.seed,
                slots,
                steps,
            ).action
        sizing = kelly_size_ref(
            r_probs,
            model.centres,
            action - 1,
            self.tick_values[slots],
            regime,
            spread_ticks=batch.features[:, self.costs.spread_column],
            position=positions,
            policy=self.policy,
            fee_per_contract=self.costs.fee_per_contract,
        )
        return RawDecision(
            action=action,
            direction=(action - 1).astype(np.int8),
            target=np.where(tradable, sizing.target, positions).astype(np.int32),
            valid=tradable,
            q=q.astype(np.float32),
            ret_mean=r_mean.astype(np.float32),
            ret_var=r_var.astype(np.float32),
            f_star=sizing.f_star,
            size=np.where(tradable, sizing.size, 0.0),
            regime_scale=sizing.scale,
            step=steps,
        )

    def steps(self) -> npt.NDArray[np.uint64]:
        return self._steps.copy()

    def device_us(self) -> float | None:
        return None

    def release(self) -> None:
        self._open = False
