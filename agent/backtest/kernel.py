"""What both backtest drivers share: the decision step, the execution model and the P&L books.

DESIGN section 3: the event-driven driver (:mod:`agent.backtest.event`) and the vectorised one
(:mod:`agent.backtest.fast`) differ only in how bars are produced (incremental vs vectorised
features, :mod:`feeds.features`) and how an order meets the book (the paper broker walking the
book at arrival vs an instant fill at the bar-close touch). Everything else is here, written once:

* :func:`model_inputs`: the model's input row for a bar, the market features plus the two agent
  features built exactly as the daemon builds them (:func:`agent.train.env.agent_features`);
* :class:`Decider`: the policy. :class:`ModelDecider` is the daemon's
  :class:`~agent.gpu.engine.InferenceEngine` (window push, Mamba2, C51 + return head, Thompson
  keyed by (seed, slot, decision index), Kelly x regime); :class:`BaselineDecider` gives the
  flat / random / always-long baselines through the same interface;
* :class:`DecisionLog`: every decision row (time, action, target, Kelly size, regime scale, ...);
* :func:`bar_pnl`: per-bar P&L of a fill list marked at the bar-close mids (the ledger maths of
  :mod:`agent.execution.fills`), which both drivers report from.

Units: prices are 1e-9 fixed point (as in DBN) held in float64; P&L and costs are in account
currency; positions in contracts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from agent.backtest.errors import BacktestError
from agent.gpu.backend import DeviceKind, select_backend
from agent.gpu.engine import InferenceEngine
from agent.gpu.errors import GpuError
from agent.model.checkpoint import Checkpoint
from agent.policy.config import PolicyConfig
from agent.policy.philox import Purpose, philox_uniforms
from agent.train.baselines import BASELINES
from agent.train.env import agent_features
from feeds.config import InstrumentSpec
from feeds.records import PRICE_SCALE

__all__ = [
    "BarPnl",
    "BaselineDecider",
    "Decided",
    "Decider",
    "DecisionLog",
    "ModelDecider",
    "bar_pnl",
    "model_inputs",
]

F64 = npt.NDArray[np.float64]


def model_inputs(
    features: npt.NDArray[np.float32],
    *,
    positions: npt.NDArray[np.int64],
    entry_px: F64,
    mid_ticks: F64,
    tick_px: F64,
    reward_scale: float,
) -> npt.NDArray[np.float32]:
    """Rows ``[B, F + 2]`` for the engine: market features ``[B, F]`` plus the agent's unit
    position and unrealised P&L (``sign(pos) * (mid_ticks - entry_px / tick_px)`` in ticks,
    normalised and clipped), exactly as the daemon computes them. ``entry_px`` is the average
    entry price of the open position (1e-9 fixed point, ignored when flat), ``mid_ticks`` the bar
    frame's close mid in ticks and ``tick_px`` the tick in fixed point."""
    unit = np.sign(positions).astype(np.float64)
    upnl = np.where(positions != 0, unit * (mid_ticks - entry_px / tick_px), 0.0)
    agent = agent_features(np, unit.astype(np.float32), upnl, reward_scale)
    return np.concatenate([np.asarray(features, dtype=np.float32), agent], axis=1)


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

    def take(self, mask: npt.NDArray[np.bool_]) -> Decided:
        """The rows selected by ``mask``."""
        return Decided(
            self.action[mask], self.target[mask], self.valid[mask], self.size[mask], self.kelly_f[mask]
        )


class Decider(Protocol):
    """The policy of a backtest: one call per batch of bars (distinct slots)."""

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


class ModelDecider:
    """The daemon's inference engine over ``n_slots`` slots with per-slot tick values."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        policy: PolicyConfig,
        tick_values: Sequence[float],
        device: DeviceKind,
        *,
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
            self.engine = InferenceEngine(
                checkpoint, policy, tick_values, backend=backend, max_batch=max_batch
            )
        except GpuError as exc:
            self.close_limits()
            raise BacktestError(f"checkpoint {checkpoint.sha256[:12]} cannot be served: {exc}") from None

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
        self.engine.close()
        self.close_limits()

    def close_limits(self) -> None:
        """Give the BLAS thread pools their previous sizes back."""
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None

    @property
    def window(self) -> int:
        return self.engine.window


class BaselineDecider:
    """A baseline of :data:`agent.train.baselines.BASELINES` as a :class:`Decider`: ``flat``,
    ``long`` (always ``max_contracts`` long) or ``random`` (uniform over short/flat/long, drawn
    from Philox keyed by (seed, slot, decision index): reproducible whatever the batching).
    Healthy rows are valid; no window or sizing is involved."""

    def __init__(self, name: str, n_slots: int, max_contracts: int, seed: int) -> None:
        if name not in BASELINES:
            raise BacktestError(f"unknown baseline {name!r} (known: {', '.join(BASELINES)})")
        self.name = name
        self.max_contracts = max_contracts
        self.seed = seed
        self._steps = np.zeros(n_slots, dtype=np.uint64)

    def decide(
        self,
        slots: npt.NDArray[np.int64],
        rows: npt.NDArray[np.float32],
        positions: npt.NDArray[np.int64],
        regime: F64,
        healthy: npt.NDArray[np.bool_],
    ) -> Decided:
        n = slots.shape[0]
        if self.name == "flat":
            action = np.ones(n, dtype=np.int32)
        elif self.name == "long":
            action = np.full(n, 2, dtype=np.int32)
        else:
            # block 1 of the Thompson stream: never the draws the model's Thompson choice uses (block 0)
            u = philox_uniforms(self.seed, slots, self._steps[slots], Purpose.THOMPSON, block=1)[:, 0]
            action = np.minimum((u * 3.0).astype(np.int32), 2)
        self._steps[slots] += np.uint64(1)
        valid = np.asarray(healthy, dtype=bool)
        target = np.where(valid, (action - 1) * self.max_contracts, positions).astype(np.int32)
        size = np.where(valid & (action != 1), 1.0, 0.0)
        return Decided(action, target, valid, size, size.copy())

    def close(self) -> None:
        return None

    @property
    def window(self) -> int:
        return 1


@dataclass
class DecisionLog:
    """Every decision row a driver took, in the order taken (concatenated on :meth:`arrays`)."""

    parts: dict[str, list[np.ndarray[Any, Any]]] = field(
        default_factory=lambda: {
            k: []
            for k in (
                "ts_ns",
                "instrument",
                "bar",
                "action",
                "valid",
                "target",
                "size",
                "kelly_f",
                "regime",
                "position",
            )
        }
    )

    def add(
        self,
        *,
        ts_ns: npt.ArrayLike,
        instrument: npt.ArrayLike,
        bar: npt.ArrayLike,
        decided: Decided,
        regime: npt.ArrayLike,
        position: npt.ArrayLike,
    ) -> None:
        """Append one batch (``instrument``: index into the backtest's instruments; ``bar``: the
        bar's index in its instrument's bar sequence; ``position`` before the decision)."""
        for key, value in (
            ("ts_ns", ts_ns),
            ("instrument", instrument),
            ("bar", bar),
            ("action", decided.action),
            ("valid", decided.valid),
            ("target", decided.target),
            ("size", decided.size),
            ("kelly_f", decided.kelly_f),
            ("regime", regime),
            ("position", position),
        ):
            self.parts[key].append(np.atleast_1d(np.asarray(value)))

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """Column arrays sorted by (time, instrument)."""
        cols = {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}
        order = np.lexsort((cols["instrument"], cols["ts_ns"])) if cols["ts_ns"].size else np.zeros(0, int)
        return {k: v[order] for k, v in cols.items()}


class BarPnl(NamedTuple):
    """Per-bar books of one instrument (all ``[T]``, bar order)."""

    pnl: F64
    """Net P&L of the bar in currency: fills' cash flows, fees and the position marked from the
    previous bar's mid to this bar's."""
    cost: F64
    """Fees plus slippage against the decision bar's mid (currency)."""
    traded: F64
    """Contracts traded at the bar."""
    held: F64
    """Absolute position held over the bar (the one its mark-to-market move applies to)."""
    position: F64
    """Position after the bar's fills."""


def bar_pnl(
    spec: InstrumentSpec,
    mark_px: F64,
    *,
    fill_bar: npt.NDArray[np.int64],
    fill_qty: F64,
    fill_px: F64,
    fill_fee: F64,
) -> BarPnl:
    """Books of one instrument from its fills, each attributed to the bar whose decision sent it.

    ``mark_px`` ``[T]``: the bar-close mid (1e-9 fixed point), carried forward over bars whose
    book was not trusted. Equity at bar ``k`` is ``cash(<= k) + position(<= k) * mark_k`` minus
    fees; ``pnl`` is its difference. Its sum equals the ledger's realised plus unrealised P&L at
    the last mark, net of fees.
    """
    n = mark_px.shape[0]
    per_px = spec.tick_value / (spec.tick_size * PRICE_SCALE)
    qty = np.bincount(fill_bar, weights=fill_qty, minlength=n)[:n]
    cash = np.bincount(fill_bar, weights=-fill_qty * fill_px, minlength=n)[:n]
    fee = np.bincount(fill_bar, weights=fill_fee, minlength=n)[:n]
    slip = np.bincount(fill_bar, weights=fill_qty * (fill_px - mark_px[fill_bar]), minlength=n)[:n]
    traded = np.bincount(fill_bar, weights=np.abs(fill_qty), minlength=n)[:n]
    position = np.cumsum(qty)
    equity = (np.cumsum(cash) + position * mark_px) * per_px - np.cumsum(fee)
    pnl = np.diff(equity, prepend=0.0)
    held = np.abs(np.concatenate([[0.0], position[:-1]]))
    return BarPnl(pnl, fee + slip * per_px, traded.astype(np.float64), held, position.astype(np.float64))
