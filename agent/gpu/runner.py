"""What the engine hands a compute path (CPU or CUDA) and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from agent.gpu.errors import InferenceError
from agent.model.checkpoint import Checkpoint

__all__ = ["Batch", "Costs", "RawDecision", "Runner", "column", "column_error"]


@dataclass(frozen=True, slots=True)
class Costs:
    """What the sizing's cost gate charges (:func:`agent.policy.kelly.leg_cost`)."""

    fee_per_contract: float
    """Broker fee per contract and leg (currency)."""
    spread_column: int
    """Column of the raw feature rows holding the book's spread in ticks."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One decision batch of B rows: slots and feature rows checked by the engine (distinct slots
    in range, (B, F) float32); the per-row columns as the caller gave them, a scalar or B
    entries, broadcast by the runner (:func:`column`)."""

    slots: npt.NDArray[np.int32]
    features: npt.NDArray[np.float32]  # (B, F) raw feature rows of the new bar
    positions: npt.ArrayLike
    regime: npt.ArrayLike
    healthy: npt.ArrayLike


@dataclass(slots=True)
class RawDecision:
    """What a runner computes, per row (the engine hands its arrays on in a :class:`Decision`;
    not frozen: a frozen dataclass's construction costs a microsecond more a decision)."""

    action: npt.NDArray[np.int32]
    direction: npt.NDArray[np.int8]  # action - 1
    target: npt.NDArray[np.int32]
    valid: npt.NDArray[np.bool_]  # pushed (healthy, finite) and the window full
    q: npt.NDArray[np.float32]
    ret_mean: npt.NDArray[np.float32]
    ret_var: npt.NDArray[np.float32]
    f_star: npt.NDArray[np.float64]
    size: npt.NDArray[np.float64]  # 0 where the row is not valid
    regime_scale: npt.NDArray[np.float64]  # clamped to [scale_floor, 1]
    step: npt.NDArray[np.uint64]  # the slot's decision index (the Thompson key)


def column_error(n: int, exc: Exception) -> InferenceError:
    """The error for a per-row column that does not fit B = ``n`` rows."""
    return InferenceError(f"positions, regime_scale and healthy must have {n} entries: {exc}")


def column(value: npt.ArrayLike, dtype: type[np.generic], n: int) -> npt.NDArray[Any]:
    """A per-row column as ``n`` entries of ``dtype`` (a scalar is repeated)."""
    try:
        return np.broadcast_to(np.asarray(value, dtype=dtype), (n,))
    except ValueError as exc:
        raise column_error(n, exc) from None


class Runner(Protocol):
    """A compute path (CPU or CUDA), owning the slots' windows and counters (bars pushed,
    decisions made). ``prepare`` builds a model's buffer set; ``run`` decides one batch with a
    prepared set (a malformed per-row column raises :class:`InferenceError` before anything
    changes); ``steps`` copies the per-slot decision counters; ``device_us`` is the device time
    of the last ``run`` (None on the CPU); ``release`` frees the device resources."""

    def prepare(self, checkpoint: Checkpoint) -> object: ...

    def run(self, model: object, batch: Batch) -> RawDecision: ...

    def steps(self) -> npt.NDArray[np.uint64]: ...

    def device_us(self) -> float | None: ...

    def release(self) -> None: ...
