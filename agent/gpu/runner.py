"""What the engine hands a compute path (CPU or CUDA) and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from agent.model.checkpoint import Checkpoint

__all__ = ["Batch", "RawDecision", "Runner"]


@dataclass(frozen=True, slots=True)
class Batch:
    """Validated, typed inputs of one decision batch (B rows)."""

    slots: npt.NDArray[np.int32]
    features: npt.NDArray[np.float32]  # (B, F) raw feature rows of the new bar
    positions: npt.NDArray[np.int32]
    regime: npt.NDArray[np.float32]
    push: npt.NDArray[np.bool_]  # healthy and finite: the row enters the window
    tradable: npt.NDArray[np.bool_]  # push and the window is full after it
    steps: npt.NDArray[np.uint64]


@dataclass(frozen=True, slots=True)
class RawDecision:
    """What a runner computes; the engine adds the host-side bookkeeping."""

    action: npt.NDArray[np.int32]
    target: npt.NDArray[np.int32]
    q: npt.NDArray[np.float32]
    ret_mean: npt.NDArray[np.float32]
    ret_var: npt.NDArray[np.float32]
    f_star: npt.NDArray[np.float64]
    size: npt.NDArray[np.float64]  # 0 where the row is not tradable


class Runner(Protocol):
    """A compute path (CPU or CUDA). ``prepare`` builds a model's buffer set; ``run`` decides
    one batch with a prepared set; ``release`` frees the device resources."""

    def prepare(self, checkpoint: Checkpoint) -> object: ...

    def run(self, model: object, batch: Batch) -> RawDecision: ...

    def release(self) -> None: ...
