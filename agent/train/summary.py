"""What a training run reports: the JSON summary (:class:`TrainSummary`, one
:class:`FoldSummary` per fold, the :class:`GateDecision`) and the out-of-sample per-bar curves
behind the report and the gate (:class:`Curves`), returned together as :class:`RunResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy as np

from agent.backtest.metrics import Performance, bucket_sums, performance
from agent.train.gates import GateEvent, PnlSeries, probabilistic_sharpe
from agent.train.trainer import EpochRecord

__all__ = [
    "Curves",
    "FoldSummary",
    "FoldTrading",
    "GateDecision",
    "PnlRecord",
    "RunResult",
    "TrainSummary",
    "fold_trading",
]


class FoldTrading(msgspec.Struct, frozen=True, kw_only=True):
    """One policy on one fold's test block (currency figures in the account currency)."""

    pnl: float
    """Net P&L after costs."""
    sharpe: float
    """Annualised Sharpe of the bucketed P&L (:mod:`agent.backtest.metrics`)."""
    psr: float
    """Probabilistic Sharpe ratio against flat (P[true Sharpe > 0])."""
    costs: float
    turnover: float
    """Contracts traded per trading day."""
    hit_rate: float
    max_drawdown: float

    @classmethod
    def of(cls, perf: Performance, psr: float) -> FoldTrading:
        return cls(
            pnl=perf.pnl,
            sharpe=perf.sharpe,
            psr=psr,
            costs=perf.costs,
            turnover=perf.turnover,
            hit_rate=perf.hit_rate,
            max_drawdown=perf.max_drawdown,
        )


class FoldSummary(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    train_ns: tuple[int, int]
    test_ns: tuple[int, int]
    test_from: str
    """The test block replayed as traded: ``[test_from, test_to)``, ISO 8601 UTC (what
    ``tradeagent backtest --from test_from --to test_to`` replays)."""
    test_to: str
    checkpoint_sha256: str
    """The fold's model as it was evaluated (params and normalisation after this fold), written
    to the checkpoint store with the run's results: ``tradeagent backtest --checkpoint
    <checkpoint_sha256> --from <test_from> --to <test_to>`` replays the block as it was scored."""
    as_traded: FoldTrading
    """The daemon's policy (the configured ``policy.selection``, greedy by default; Kelly x
    regime with the cost gate; risk limits; fills walking the book at arrival + latency; fees)
    through the event-driven backtest: what the promotion gate scores."""
    greedy_unit: FoldTrading
    """Diagnostic, never gated: the network's greedy action at one contract in the training
    environment (fills at the book met at arrival + latency, as the paper broker's, and fees),
    each evaluation chunk starting flat."""
    baselines: dict[str, FoldTrading]
    """Flat, random and always-long, as traded on the same bars."""
    incumbent: FoldTrading | None = None
    """The promoted model, as traded on the same bars (None without one)."""
    as_traded_mix: list[float]
    """Fractions of short, flat, long among the valid as-traded decisions."""
    greedy_mix: list[float]
    """Fractions of short, flat, long among the greedy diagnostic's decisions."""


class GateDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The promotion decision in one place: passed, and why not."""

    passed: bool
    reasons: list[str]


class TrainSummary(msgspec.Struct, kw_only=True):
    """The JSON summary of a run (``--summary PATH``)."""

    run_id: int | None = None
    instrument_set: str = ""
    device: str = ""
    seed: int = 0
    promoted: bool = False
    halted: bool = False
    halt_reason: str | None = None
    timed_out: bool = False
    candidate_sha256: str | None = None
    candidate_status: str | None = None
    incumbent_sha256: str | None = None
    incumbent_sharpe: float | None = None
    incumbent_note: str | None = None
    gate: GateDecision | None = None
    folds: list[FoldSummary] = msgspec.field(default_factory=list)
    oos: Performance | None = None
    """The concatenated out-of-sample test blocks, as traded."""
    oos_baselines: dict[str, Performance] = msgspec.field(default_factory=dict)
    oos_greedy_unit: Performance | None = None
    gates: list[GateEvent] = msgspec.field(default_factory=list)
    epochs: list[EpochRecord] = msgspec.field(default_factory=list)
    floors: dict[str, dict[str, float | None]] = msgspec.field(default_factory=dict)
    drift_abs: float = 0.0
    drift_ratio: float = 0.0
    wall_s: float = 0.0
    train_s: float = 0.0
    """Of ``wall_s``, the time spent in the training loops (exploring and learning)."""


class PnlRecord(Protocol):
    """Per-bar books of a policy (a training-env rollout, or a backtest's books)."""

    @property
    def pnl(self) -> np.ndarray[Any, Any]: ...
    @property
    def cost(self) -> np.ndarray[Any, Any]: ...
    @property
    def traded(self) -> np.ndarray[Any, Any]: ...
    @property
    def held(self) -> np.ndarray[Any, Any]: ...
    @property
    def ts_ns(self) -> np.ndarray[Any, Any]: ...


@dataclass
class Curves:
    """Concatenated out-of-sample per-bar records per policy (for the report and the gate):
    ``candidate``, ``incumbent`` and the baselines as traded, ``greedy_unit`` the diagnostic."""

    records: dict[str, list[PnlRecord]] = field(default_factory=dict)

    def add(self, name: str, ro: PnlRecord) -> None:
        self.records.setdefault(name, []).append(ro)

    def series(self, name: str, *, gross: bool = False) -> PnlSeries:
        """The concatenated per-bar net P&L and close times of ``name`` (the gate's input);
        ``gross``: before costs (fees and slippage against the decision bar's mid added back)."""
        parts = self.records.get(name, [])
        if not parts:
            return PnlSeries(pnl=np.zeros(0), ts_ns=np.zeros(0, np.int64))
        pnl = np.concatenate([r.pnl + r.cost if gross else r.pnl for r in parts])
        return PnlSeries(pnl=pnl, ts_ns=np.concatenate([r.ts_ns for r in parts]))

    def performance(self, name: str, bucket_s: float) -> Performance:
        parts = self.records.get(name, [])
        if not parts:
            return performance([], [], [], [], [], bucket_s=bucket_s)

        def cat(key: str) -> np.ndarray[Any, Any]:
            return np.concatenate([getattr(r, key) for r in parts])

        return performance(
            cat("pnl"), cat("cost"), cat("traded"), cat("held"), cat("ts_ns"), bucket_s=bucket_s
        )

    def equity(self, name: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(ts, cumulative net P&L) in time order."""
        parts = self.records.get(name, [])
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        ts = np.concatenate([r.ts_ns for r in parts])
        pnl = np.concatenate([r.pnl for r in parts])
        order = np.argsort(ts, kind="stable")
        return ts[order], np.cumsum(pnl[order])


@dataclass
class RunResult:
    """What :func:`agent.train.walkforward.run_training` returns: the JSON summary and the per-bar
    curves behind the report."""

    summary: TrainSummary
    curves: Curves


def fold_trading(books: PnlRecord, bucket_s: float) -> FoldTrading:
    """A policy's figures on one test block, with its probabilistic Sharpe against flat."""
    perf = performance(books.pnl, books.cost, books.traded, books.held, books.ts_ns, bucket_s=bucket_s)
    bucket = perf.bucket_s
    returns = (
        bucket_sums(books.pnl, books.ts_ns, max(1, round(bucket * 1e9))) if books.pnl.size else books.pnl
    )
    return FoldTrading.of(perf, probabilistic_sharpe(returns))
