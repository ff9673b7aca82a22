"""The policy a trading step consults: one call per batch of bars (distinct slots).

* :class:`ModelDecider` is the daemon's :class:`~agent.gpu.engine.InferenceEngine` (window
  push, Mamba2, C51 + return head, the ``policy.selection`` action: greedy, or Thompson keyed
  by (seed, slot, decision index); Kelly x regime with the instrument's round-trip cost);
* :class:`EngineDecider` adapts an engine someone else owns (the daemon's model host, which
  hot-swaps and falls back to the CPU);
* :class:`BaselineDecider` gives the flat / random / always-long baselines through the same
  interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from agent.errors import AgentError
from agent.gpu.backend import DeviceKind, select_backend
from agent.gpu.engine import InferenceEngine
from agent.gpu.errors import GpuError
from agent.model.checkpoint import Checkpoint
from agent.policy.config import PolicyConfig
from agent.policy.philox import Purpose, philox_uniforms

__all__ = [
    "BASELINES",
    "BaselineDecider",
    "Decided",
    "Decider",
    "DeciderError",
    "EngineDecider",
    "ModelDecider",
]

BASELINES: tuple[str, ...] = ("flat", "random", "long")
"""The baseline policies every candidate is compared with (:class:`BaselineDecider`)."""

F64 = npt.NDArray[np.float64]


class DeciderError(AgentError):
    """A policy that cannot be built (an unknown baseline, a checkpoint the engine refuses)."""


@dataclass(frozen=True, slots=True)
class Decided:
    """One decision batch (all ``[B]``)."""

    action: npt.NDArray[np.int32]
    """Index into (short, flat, long)."""
    target: npt.NDArray[np.int32]
    """Target position in contracts; the current one where ``valid`` is false."""
    valid: npt.NDArray[np.bool_]
    size: F64
    """Kelly size in [0, 1] (before the regime scale and max_contracts)."""
    kelly_f: F64

    @classmethod
    def concat(cls, parts: Sequence[Decided]) -> Decided:
        """The rows of ``parts``, in order, as one decision (the drivers log a run's at once)."""
        return cls(*(np.concatenate([getattr(d, f.name) for d in parts]) for f in fields(cls)))

    def take(self, rows: npt.NDArray[np.bool_] | slice) -> Decided:
        """The rows selected by ``rows`` (a mask or a slice)."""
        return Decided(
            self.action[rows], self.target[rows], self.valid[rows], self.size[rows], self.kelly_f[rows]
        )


class Decider(Protocol):
    """The policy a trading step consults: one call per batch of bars (distinct slots). The
    arrays of a returned :class:`Decided` are the caller's: no later call writes them, and none
    is an input array handed back (the drivers keep a run's decisions and log them at once)."""

    def decide(
        self,
        slots: npt.NDArray[np.int64],
        rows: npt.NDArray[np.float32],
        positions: npt.NDArray[np.int64],
        regime: F64,
        healthy: npt.NDArray[np.bool_],
    ) -> Decided: ...

    def close(self) -> None: ...

    @property
    def window(self) -> int:
        """Bars a slot needs before its decisions are valid (the model's K; 1 for baselines)."""
        ...


class EngineDecider:
    """A :class:`Decider` over an engine owned elsewhere (the daemon's model host swaps and
    rebuilds it; this only asks it)."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine

    def decide(
        self,
        slots: npt.NDArray[np.int64],
        rows: npt.NDArray[np.float32],
        positions: npt.NDArray[np.int64],
        regime: F64,
        healthy: npt.NDArray[np.bool_],
    ) -> Decided:
        d = self.engine.decide(slots, rows, positions, regime, healthy)
        return Decided(d.action, d.target, d.valid, d.size, d.kelly_f)

    def close(self) -> None:
        return None

    @property
    def window(self) -> int:
        return self.engine.window


class ModelDecider(EngineDecider):
    """The daemon's inference engine over ``n_slots`` slots with per-slot tick values."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        policy: PolicyConfig,
        tick_values: Sequence[float],
        device: DeviceKind,
        *,
        fee_per_contract: float,
        max_batch: int,
        cpu_threads: int = 1,
    ) -> None:
        backend = select_backend(device)
        # On the CPU the model's small matrices run fastest on one BLAS thread (and a thread pool
        # per core oversubscribes a busy machine): the trainer's ``train.cpu_threads`` setting,
        # held for the engine's life.
        self._limits = (
            threadpool_limits(limits=cpu_threads, user_api="blas")
            if not backend.is_cuda and cpu_threads > 0
            else None
        )
        try:
            engine = InferenceEngine(
                checkpoint,
                policy,
                tick_values,
                fee_per_contract=fee_per_contract,
                backend=backend,
                max_batch=max_batch,
            )
        except GpuError as exc:
            self.close_limits()
            raise DeciderError(f"checkpoint {checkpoint.sha256[:12]} cannot be served: {exc}") from None
        super().__init__(engine)

    def close(self) -> None:
        self.engine.close()
        self.close_limits()

    def close_limits(self) -> None:
        """Give the BLAS thread pools their previous sizes back."""
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None


class BaselineDecider:
    """Baselines of :data:`BASELINES` as one :class:`Decider`: ``flat``, ``long`` (always
    ``max_contracts`` long) or ``random`` (uniform over short/flat/long, drawn from Philox keyed by
    (seed, slot, decision index): reproducible whatever the batching). Healthy rows are valid; no
    window or sizing is involved.

    With several ``names`` the baselines run side by side: slot ``b * n_slots + i`` is baseline
    ``names[b]`` on slot ``i``, keyed as slot ``i`` (so each baseline's decisions are those it
    makes alone)."""

    _BLOCK = 4096
    """Random draws generated at once per slot (the same values as one by one)."""

    def __init__(self, names: str | Sequence[str], n_slots: int, max_contracts: int, seed: int) -> None:
        self.names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in self.names if n not in BASELINES]
        if unknown or not self.names:
            raise DeciderError(f"unknown baseline {unknown!r} (known: {', '.join(BASELINES)})")
        self.n_slots = n_slots
        self.max_contracts = max_contracts
        self.seed = seed
        total = n_slots * len(self.names)
        self._kind = np.repeat([BASELINES.index(n) for n in self.names], n_slots)
        self._steps = np.zeros(total, dtype=np.uint64)
        self._draws = np.zeros((total, self._BLOCK), dtype=np.float32)
        self._drawn_from = np.full(total, np.iinfo(np.uint64).max, dtype=np.uint64)

    def _uniforms(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """This decision's draw of each of ``slots`` (block 1 of the Thompson stream: never the
        draws the model's Thompson choice uses, block 0)."""
        steps = self._steps[slots]
        first = self._drawn_from[slots]  # the uint64 maximum where no block was drawn yet
        for k in np.flatnonzero((steps < first) | (steps - first >= np.uint64(self._BLOCK))):
            slot, step = int(slots[k]), steps[k]
            ahead = step + np.arange(self._BLOCK, dtype=np.uint64)
            self._draws[slot] = philox_uniforms(
                self.seed, slot % self.n_slots, ahead, Purpose.THOMPSON, block=1
            )[:, 0]
            self._drawn_from[slot] = step
        return self._draws[slots, (steps - self._drawn_from[slots]).astype(np.int64)]

    def decide(
        self,
        slots: npt.NDArray[np.int64],
        rows: npt.NDArray[np.float32],
        positions: npt.NDArray[np.int64],
        regime: F64,
        healthy: npt.NDArray[np.bool_],
    ) -> Decided:
        kind = self._kind[slots]
        action = np.where(kind == BASELINES.index("long"), 2, 1).astype(np.int32)
        random = kind == BASELINES.index("random")
        if random.any():
            u = self._uniforms(slots[random])
            action[random] = np.minimum((u * 3.0).astype(np.int32), 2)
        self._steps[slots] += np.uint64(1)
        valid = np.array(healthy, dtype=bool)  # a copy: the caller's array stays its own
        target = np.where(valid, (action - 1) * self.max_contracts, positions).astype(np.int32)
        size = np.where(valid & (action != 1), 1.0, 0.0)
        return Decided(action, target, valid, size, size.copy())

    def close(self) -> None:
        return None

    @property
    def window(self) -> int:
        return 1
