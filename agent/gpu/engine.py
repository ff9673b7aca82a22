"""The batched inference engine: from one bar's feature rows to target positions.

One :class:`InferenceEngine` serves a fixed set of instrument (or environment) *slots*. Per
slot its compute path owns the K-bar window of raw feature rows, the count of rows pushed and
the decision counter that keys the Thompson draws. :meth:`InferenceEngine.decide` takes a
batch of slots with their new bar and returns a :class:`Decision` per row:

    window push -> Mamba2 encoder -> C51 + return head -> Thompson action -> Kelly x regime size

A row enters the window when its instrument is healthy and every feature is finite; it is
*tradable* when it entered and the slot has seen at least K such bars. Only tradable rows get a
sized target, other rows keep their current position (no new order) and say so in
``Decision.valid``.

Two paths compute the same maths (DESIGN section 6):

* CPU (:mod:`agent.gpu.cpu_runner`): the model's NumPy forward and the policy references;
* CUDA (:mod:`agent.gpu.cuda_runner`): one fused kernel a batch (the whole chain, the
  counters included), replayed as a CUDA graph per batch-size bucket, inputs and outputs in
  pinned mapped host memory, one event synchronisation and one output copy a call.

Hot swap: :meth:`InferenceEngine.load` prepares a new checkpoint in its own buffer set (packed
parameters, scratch and graphs) while decisions continue, then switches it in under the lock
that every decision holds: the switch falls between two decisions, never inside one. A load
that fails raises :class:`ModelLoadError` and leaves the serving model untouched. A failure
inside a decision raises :class:`InferenceError` (the daemon stops new orders on it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.gpu.backend import Backend
from agent.gpu.cpu_runner import CpuRunner
from agent.gpu.cuda_runner import CudaRunner
from agent.gpu.errors import GpuError, InferenceError, ModelLoadError
from agent.gpu.runner import Batch, Costs, Runner
from agent.model.checkpoint import Checkpoint
from agent.model.heads import ACTIONS
from agent.policy.config import PolicyConfig

__all__ = ["SPREAD_FEATURE", "Decision", "InferenceEngine", "check_serving_shape", "spread_column"]

SPREAD_FEATURE = "spread_ticks"
"""The raw input feature the sizing's cost gate reads (spread of the bar-close book, ticks)."""

MAX_BINS = 64
"""Return bins the sizing kernel handles."""
MAX_ATOMS = 128
"""C51 atoms the softmax kernel handles."""

_FEW_SLOTS = 64
"""Up to this many slots a batch's range check runs on Python ints (a NumPy reduction costs
more at one row and far less at thousands)."""


@dataclass(slots=True)
class Decision:
    """Per-row results of one :meth:`InferenceEngine.decide` call (all arrays (B,) or (B, A)).
    Not frozen, as :class:`~agent.gpu.runner.RawDecision`: a frozen dataclass of 13 fields costs
    ~0.8 us more to build (1.02 against 0.23 us on the 2-core machine), on every decision's
    host path."""

    slots: npt.NDArray[np.int32]
    action: npt.NDArray[np.int32]
    """Thompson choice, index into ``ACTIONS`` (short, flat, long)."""
    direction: npt.NDArray[np.int8]
    """-1, 0, +1 (action - 1)."""
    target: npt.NDArray[np.int32]
    """Target position in contracts; the current position where ``valid`` is false."""
    valid: npt.NDArray[np.bool_]
    """The row was tradable (healthy, finite, window full) and ``target`` is the policy's."""
    q: npt.NDArray[np.float32]
    """(B, A) expected C51 value per action (normalised reward units)."""
    ret_mean_ticks: npt.NDArray[np.float32]
    """Mean of the return head's next-horizon mid move, ticks."""
    ret_var_ticks: npt.NDArray[np.float32]
    """Its variance, ticks^2."""
    kelly_f: npt.NDArray[np.float64]
    """Exact Kelly fraction f* in the chosen direction (0 when flat, inf when no bin loses)."""
    size: npt.NDArray[np.float64]
    """clip(kelly_fraction * f*, 0, 1); 0 for rows that are not valid."""
    regime_scale: npt.NDArray[np.float64]
    """Regime scale applied, clamped to [scale_floor, 1]."""
    step: npt.NDArray[np.uint64]
    """Decision index of the slot used to key the Thompson draws."""
    model_sha256: str
    """The checkpoint that made these decisions."""


def spread_column(checkpoint: Checkpoint) -> int:
    """The input column holding the book's spread in ticks (the sizing's cost gate reads it)."""
    try:
        return list(checkpoint.feature_names).index(SPREAD_FEATURE)
    except ValueError:
        raise ModelLoadError(
            f"checkpoint {checkpoint.sha256[:12]} has no {SPREAD_FEATURE!r} input: the sizing needs it"
        ) from None


def check_serving_shape(checkpoint: Checkpoint, window: int, n_features: int) -> None:
    """Raise :class:`ModelLoadError` unless the engine can serve ``checkpoint``."""
    cfg = checkpoint.config
    if (cfg.window, cfg.n_features) != (window, n_features):
        raise ModelLoadError(
            f"checkpoint {checkpoint.sha256[:12]} reads windows of {cfg.window} bars x {cfg.n_features} "
            f"features; this engine holds {window} x {n_features} (restart to change the window shape)"
        )
    if cfg.n_actions != len(ACTIONS):
        raise ModelLoadError(f"checkpoint has {cfg.n_actions} actions; the policy needs {len(ACTIONS)}")
    if cfg.n_atoms > MAX_ATOMS or cfg.return_bins > MAX_BINS:
        raise ModelLoadError(
            f"checkpoint has {cfg.n_atoms} atoms and {cfg.return_bins} return bins; "
            f"at most {MAX_ATOMS} and {MAX_BINS} are supported"
        )


class InferenceEngine:
    """Batched decisions for ``len(tick_values)`` slots on one backend.

    Args:
        checkpoint: the model to serve first (fixes K and F for the engine's life).
        policy: Thompson seed and Kelly sizing settings.
        tick_values: currency value of one tick of one contract, per slot.
        fee_per_contract: the broker's fee per contract and leg (currency): with the spread of
            each row's book (its ``spread_ticks`` feature) the cost per leg the sizing must clear.
        backend: from :func:`agent.gpu.backend.select_backend`.
        max_batch: most rows in one :meth:`decide` call (CUDA graphs exist for the
            power-of-two buckets 1, 2, 4, ... up to it).

    Thread safety: :meth:`decide` calls are serialised; :meth:`load` may run on another thread.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        policy: PolicyConfig,
        tick_values: Sequence[float],
        *,
        fee_per_contract: float,
        backend: Backend,
        max_batch: int = 64,
    ) -> None:
        ticks = np.asarray(tick_values, dtype=np.float64)
        if ticks.ndim != 1 or ticks.size == 0 or not (np.isfinite(ticks).all() and (ticks > 0).all()):
            raise ModelLoadError("tick_values must be a non-empty list of positive numbers (one per slot)")
        if max_batch < 1:
            raise ModelLoadError(f"max_batch must be >= 1, got {max_batch}")
        if not (np.isfinite(fee_per_contract) and fee_per_contract >= 0):
            raise ModelLoadError(f"fee_per_contract must be a number >= 0, got {fee_per_contract}")
        cfg = checkpoint.config
        self.spread_column = spread_column(checkpoint)
        self.backend = backend
        self.policy = policy
        self.max_batch = max_batch
        self.window = cfg.window
        self.n_features = cfg.n_features
        self.tick_values = ticks
        self._mark = np.zeros(ticks.size, dtype=np.int64)
        self._rows = np.arange(max_batch, dtype=np.int64)
        self._lock = threading.Lock()
        self._runner = _make_runner(
            backend,
            window=cfg.window,
            n_features=cfg.n_features,
            tick_values=ticks,
            policy=policy,
            costs=Costs(fee_per_contract, self.spread_column),
            max_batch=max_batch,
        )
        self._model, self._sha = self._prepare(checkpoint)

    @property
    def n_slots(self) -> int:
        return int(self.tick_values.size)

    @property
    def model_sha256(self) -> str:
        """The checkpoint serving now."""
        return self._sha

    def decision_index(self) -> npt.NDArray[np.uint64]:
        """Copy of the per-slot decision counters (the next decision's Thompson step)."""
        with self._lock:
            return self._runner.steps()

    def _prepare(self, checkpoint: Checkpoint) -> tuple[object, str]:
        check_serving_shape(checkpoint, self.window, self.n_features)
        if spread_column(checkpoint) != self.spread_column:
            raise ModelLoadError(
                f"checkpoint {checkpoint.sha256[:12]} reads the spread at input column "
                f"{spread_column(checkpoint)}, this engine at {self.spread_column}"
            )
        try:
            return self._runner.prepare(checkpoint), checkpoint.sha256
        except ModelLoadError:
            raise
        except Exception as exc:  # device or compiler failures while building the buffer set
            raise ModelLoadError(f"checkpoint {checkpoint.sha256[:12]} cannot be served: {exc}") from exc

    def load(self, checkpoint: Checkpoint) -> None:
        """Hot swap: prepare ``checkpoint`` beside the serving model, then switch between two
        decisions. On failure raises :class:`ModelLoadError`; the serving model is unchanged."""
        prepared = self._prepare(checkpoint)
        with self._lock:
            self._model, self._sha = prepared

    def decide(
        self,
        slots: npt.ArrayLike,
        features: npt.ArrayLike,
        positions: npt.ArrayLike,
        regime_scale: npt.ArrayLike,
        healthy: npt.ArrayLike = True,
    ) -> Decision:
        """Decide one bar for a batch of slots.

        Args:
            slots: (B,) distinct slot indices in [0, n_slots), 1 <= B <= max_batch.
            features: (B, F) the new bar's raw feature rows (normalised by the model).
            positions: (B,) current positions in contracts (kept where a row is not valid).
            regime_scale: (B,) or scalar regime scale (clamped to [scale_floor, 1]).
            healthy: (B,) or scalar book health; an unhealthy row is neither pushed nor traded.

        Raises:
            InferenceError: malformed inputs (nothing changed), or a failure of the compute path:
                then the windows may be out of step with the engine's counters, so the caller
                stops new orders and builds a new engine before trading again.
        """
        with self._lock:
            batch = self._batch(slots, features, positions, regime_scale, healthy)
            try:
                raw = self._runner.run(self._model, batch)
            except Exception as exc:
                raise InferenceError(f"decision batch of {batch.slots.size} rows failed: {exc}") from exc
            return Decision(
                slots=batch.slots,
                action=raw.action,
                direction=raw.direction,
                target=raw.target,
                valid=raw.valid,
                q=raw.q,
                ret_mean_ticks=raw.ret_mean,
                ret_var_ticks=raw.ret_var,
                kelly_f=raw.f_star,
                size=raw.size,
                regime_scale=raw.regime_scale,
                step=raw.step,
                model_sha256=self._sha,
            )

    def device_us(self) -> float | None:
        """Device time of the last :meth:`decide` call in microseconds (None on the CPU path):
        the call's time less this is the host's share (``bench infer``'s ``host_us``)."""
        with self._lock:
            return self._runner.device_us()

    def _batch(
        self,
        slots: npt.ArrayLike,
        features: npt.ArrayLike,
        positions: npt.ArrayLike,
        regime_scale: npt.ArrayLike,
        healthy: npt.ArrayLike,
    ) -> Batch:
        """Check the slots and the feature rows (nothing is changed when this raises); the
        runner broadcasts and checks the per-row columns as it writes them."""
        s = np.asarray(slots)
        n = s.size
        if s.ndim != 1 or not 1 <= n <= self.max_batch or s.dtype.kind not in "iu":
            raise InferenceError(
                f"slots must be 1 to {self.max_batch} integers, got shape {s.shape} {s.dtype}"
            )
        s32 = s.astype(np.int32)
        repeated: bool | None
        if n <= _FEW_SLOTS:  # a few Python ints: cheaper to check than NumPy calls
            ids = s.tolist()
            lo, hi, repeated = min(ids), max(ids), len(set(ids)) < n
        elif (s[1:] > s[:-1]).all():  # strictly increasing: distinct, its ends the range (one pass)
            lo, hi, repeated = int(s[0]), int(s[-1]), False
        else:  # repeats are looked for once the range holds (the mark array's indices)
            lo, hi, repeated = int(s.min()), int(s.max()), None
        if lo < 0 or hi >= self.n_slots:
            raise InferenceError(f"slot out of range [0, {self.n_slots})")
        if repeated is None:  # O(B): a repeated slot keeps only its last row index
            mark = self._mark
            mark[s32] = self._rows[:n]
            repeated = not np.array_equal(mark[s32], self._rows[:n])
        if repeated:
            raise InferenceError("a slot appears twice in one decision batch")
        f = np.asarray(features, dtype=np.float32)
        if f.shape != (n, self.n_features):
            raise InferenceError(f"features must be ({n}, {self.n_features}), got {f.shape}")
        return Batch(s32, f, positions, regime_scale, healthy)

    def close(self) -> None:
        """Free device resources; the engine cannot decide afterwards (also when this raises).

        Raises:
            GpuError: the device failed while the engine was released (after a sticky CUDA
                error, such as an illegal address, every later call on the context fails).
        """
        with self._lock:
            try:
                self._runner.release()
            except Exception as exc:
                raise GpuError(f"releasing the inference engine failed: {exc}") from exc


def _make_runner(
    backend: Backend,
    *,
    window: int,
    n_features: int,
    tick_values: npt.NDArray[np.float64],
    policy: PolicyConfig,
    costs: Costs,
    max_batch: int,
) -> Runner:
    if backend.is_cuda:
        return CudaRunner(window, n_features, tick_values, policy, costs=costs, max_batch=max_batch)
    return CpuRunner(window, n_features, tick_values, policy, costs)
