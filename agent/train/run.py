"""One training run, end to end: archive -> walk-forward folds -> gates -> registry.

Order of work (nothing is registered before the end, so a crash or a timeout leaves the
registry, the promoted model and the learned floors as they were):

1. load the archive into per-instrument bars (:mod:`agent.train.data`);
2. plan rolling folds on the timeline of the instrument with the most bars, map them to every
   instrument by time and purge training bars closer than the gap to the test block;
3. per fold: fit the normalisation on the training bars only, train (the parameters carry over
   from the previous fold, the optimiser, target network and replay are fresh), check Q-drift
   after every epoch, then evaluate the greedy policy and the baselines on the test block;
4. re-evaluate the incumbent (the promoted checkpoint of this instrument set) on the same test
   blocks with its own normalisation. It is loaded and verified (stored file, sha256, layout,
   features) before step 1: an unusable incumbent stops the run at once with
   :class:`IncumbentUnusable` (the message says how to fix it), never after the training;
   ``TrainRequest(incumbent=False)`` (``train --no-incumbent``) compares with no incumbent;
5. kill criteria and the promotion gate on the concatenated out-of-sample record;
6. the candidate is the last fold's model (trained on the most recent window, with its own
   out-of-sample block): written to the checkpoint store (tmp-then-rename), registered, then
   promoted (one transaction) or rejected; the learned floors move towards this archive's
   targets; every gate event and fold is stored with its numbers.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np
from threadpoolctl import threadpool_limits

from agent.backtest.errors import BacktestError
from agent.backtest.inputs import check_compatible, ns_iso, parse_bound
from agent.config import Config
from agent.gpu.backend import Backend, select_backend
from agent.model import ModelConfig, init_params, layout_fingerprint, param_shapes
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes, checkpoint_to_bytes
from agent.model.errors import CheckpointError
from agent.policy.regime import RegimeConfig
from agent.progress import SILENT, Progress
from agent.train.baselines import BASELINES, baseline_policy
from agent.train.cuda_learner import fused_fits, select_learner
from agent.train.data import load_archive, select_instruments
from agent.train.env import (
    AGENT_FEATURES,
    UPNL_CLIP,
    EnvData,
    FeatureNorm,
    InstrumentBars,
    Rollout,
    build_env_data,
    fit_norm,
    rollout,
)
from agent.train.errors import IncumbentUnusable, TrainError, TrainTimeout
from agent.train.evaluate import AsTradedRunner, Pending, eval_workers
from agent.train.floors import VOL_REF_FLOOR, floor_target, next_floor, vol_ema_of
from agent.train.folds import plan_folds
from agent.train.gates import (
    GateEvent,
    PnlSeries,
    drift_floor,
    kill_criteria,
    probabilistic_sharpe,
    promotion,
)
from agent.train.metrics import Performance, bucket_sums, performance
from agent.train.trainer import EpochRecord, make_probe, probe_stats, train_fold
from feeds.config import InstrumentSpec
from feeds.dbn import dbn_files
from feeds.features import FEATURE_NAMES
from storage import CheckpointStore, Instruments, LearnedFloors, ModelRegistry, open_database
from storage.errors import StorageError
from storage.values import InstrumentInfo

__all__ = ["Curves", "FoldSummary", "RunResult", "TrainRequest", "TrainSummary", "run_training"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainRequest:
    """What ``tradeagent train`` asks for."""

    data: Path
    instruments: Sequence[str] | None = None
    promote: bool = False
    deadline: float | None = None
    """``time.monotonic()`` value after which the run stops cleanly (:class:`TrainTimeout`)."""
    incumbent: bool = True
    """Compare with the promoted checkpoint of the instrument set (loaded and verified before
    training); False: the gate compares with the baselines only, and a promotion replaces the
    promoted checkpoint whatever its state (the remedy for an unusable one)."""
    bars: Mapping[str, InstrumentBars] | None = None
    """Bars already in memory (a benchmark, a caller that computed them): used instead of
    computing them from ``data`` for training. ``data`` must still be the archive they came
    from: the as-traded evaluation replays its records."""


class FoldTrading(msgspec.Struct, frozen=True, kw_only=True):
    """One policy on one fold's test block (currency figures in the account currency)."""

    pnl: float
    """Net P&L after costs."""
    sharpe: float
    """Annualised Sharpe of the bucketed P&L (:mod:`agent.train.metrics`)."""
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
    """What :func:`run_training` returns: the JSON summary and the per-bar curves behind the report."""

    summary: TrainSummary
    curves: Curves


def _gap_bars(model: ModelConfig, config: Config) -> int:
    return max(config.train.gap_bars, model.window + max(config.train.n_step, model.return_horizon))


def _fold_ranges(
    bars: dict[str, InstrumentBars], config: Config, gap: int
) -> list[tuple[tuple[int, int, int, int], dict[str, tuple[int, int, int, int]]]]:
    """Fold boundaries as times on the reference timeline and per-instrument index ranges
    ``(train_start, train_end, test_start, test_end)`` with the purge applied."""
    ref = max(bars.values(), key=len).ts_ns
    folds = plan_folds(
        ref.shape[0],
        n_folds=config.train.folds,
        train_test_ratio=config.train.train_test_ratio,
        gap_bars=gap,
        anchored=config.train.anchored,
    )
    out = []
    for f in folds:
        edges = [
            int(ref[i]) if i < ref.shape[0] else int(ref[-1]) + 1
            for i in (f.train_start, f.train_end, f.test_start, f.test_end)
        ]
        per: dict[str, tuple[int, int, int, int]] = {}
        for symbol, b in bars.items():
            a, e, s, t = (int(x) for x in np.searchsorted(b.ts_ns, edges))
            e = min(e, s - gap)  # purge: never closer than the gap to the test block
            if e - a < config.model.window + 2 or t - s < config.model.window + 2:
                raise TrainError(f"fold {f.index}: instrument {symbol} has too few bars in the fold")
            per[symbol] = (a, e, s, t)
        out.append(((edges[0], edges[1], edges[2], edges[3]), per))
    return out


def _log_returns(b: InstrumentBars, lo: int, hi: int) -> np.ndarray[Any, Any]:
    mid = b.mid_ticks[lo:hi]
    ok = b.tradable[lo:hi] & np.isfinite(mid) & (mid > 0)
    m = mid[ok]
    return np.diff(np.log(m)) if m.shape[0] > 1 else np.zeros(0)


def _evaluate(data: EnvData, policy: Any, config: Config) -> Rollout:
    return rollout(data, policy, n_envs=config.train.eval_envs, reward_scale=config.train.reward_scale)


def run_training(config: Config, request: TrainRequest, progress: Progress | None = None) -> RunResult:
    """Run one training (see the module docstring); returns the summary and the OOS curves.

    Raises :class:`TrainTimeout` when ``request.deadline`` passes before the registry is written,
    :class:`TrainError` for data that cannot be trained on, and the storage/feeds errors of the
    layers below. The registry is written only at the end.
    """
    backend: Backend = select_backend(config.device)
    limits: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if not backend.is_cuda and config.train.cpu_threads > 0:
        limits = threadpool_limits(limits=config.train.cpu_threads, user_api="blas")
    with limits:
        return _run_training(config, request, progress or SILENT, backend)


def _run_training(config: Config, request: TrainRequest, progress: Progress, backend: Backend) -> RunResult:
    started = time.monotonic()
    cfg = config.train
    xp = backend.xp
    specs = select_instruments(config.feeds, request.instruments)
    instrument_set = ",".join(sorted(s.symbol for s in specs))
    database = open_database(config.storage, config.data_dir)
    try:
        registry = ModelRegistry(database)
        store = CheckpointStore.for_data_dir(config.data_dir)
        incumbent = _load_incumbent(registry, store, instrument_set, compare=request.incumbent)
        floors_repo = LearnedFloors(database)
        Instruments(database).upsert(
            [
                InstrumentInfo(
                    instrument_id=s.instrument_id,
                    symbol=s.symbol,
                    tick_size=s.tick_size,
                    tick_value=s.tick_value,
                )
                for s in specs
            ]
        )
        current_floors = {s.symbol: floors_repo.get(s.instrument_id, VOL_REF_FLOOR) for s in specs}
        if request.bars is not None:
            missing = [spec.symbol for spec in specs if spec.symbol not in request.bars]
            if missing:
                raise TrainError(f"preloaded bars lack instrument(s) {', '.join(missing)}")
            bars = {spec.symbol: request.bars[spec.symbol] for spec in specs}
        else:
            progress.start("load", len(dbn_files(request.data)))
            bars = load_archive(
                request.data,
                config.feeds,
                specs,
                fee_per_contract=config.broker.fee_per_contract,
                latency_ms=config.broker.latency_ms,
                on_file=lambda _f: progress.advance("load"),
            )
        model_cfg = config.model.with_features(len(FEATURE_NAMES) + len(AGENT_FEATURES))
        gap = _gap_bars(model_cfg, config)
        folds = _fold_ranges(bars, config, gap)
        summary = TrainSummary(
            instrument_set=instrument_set,
            device=backend.description,
            seed=config.seed,
            drift_abs=drift_floor(model_cfg, cfg),
            drift_ratio=cfg.drift_ratio,
            incumbent_sha256=incumbent.sha256,
            incumbent_note=incumbent.note,
        )
        trade_config = msgspec.structs.replace(
            config, feeds=msgspec.structs.replace(config.feeds, instruments=tuple(specs))
        )
        jobs = len(folds) * (2 if incumbent.checkpoint is not None else 1)
        with AsTradedRunner(
            trade_config, request.data, workers=eval_workers(cfg.eval_workers, jobs)
        ) as runner:
            run = _Run(
                config=config,
                request=request,
                model_cfg=model_cfg,
                xp=xp,
                bars=bars,
                specs=specs,
                folds=folds,
                summary=summary,
                progress=progress,
                current_floors=current_floors,
                n_trials=registry.count_runs(instrument_set) + 1,
                runner=runner,
                incumbent=incumbent.checkpoint,
            )
            run.train_all()
            run.collect()
        if request.deadline is not None and time.monotonic() > request.deadline:
            raise TrainTimeout("the time limit was reached before the results were registered")
        run.decide()
        run.register(registry, floors_repo, store, current_floors)
        summary.wall_s = time.monotonic() - started
        return RunResult(summary, run.curves)
    finally:
        database.close()


@dataclass(frozen=True)
class _Incumbent:
    """The incumbent of a run: the verified checkpoint to compare with (None: none), the
    promoted hash when it is compared, and the summary's note."""

    checkpoint: Checkpoint | None
    sha256: str | None
    note: str | None


def _load_incumbent(
    registry: ModelRegistry, store: CheckpointStore, instrument_set: str, *, compare: bool
) -> _Incumbent:
    """Load and verify the promoted checkpoint of ``instrument_set`` (before any training).

    Raises :class:`IncumbentUnusable` when it cannot be traded by this code (stored file missing,
    unreadable or corrupt, wrong layout fingerprint, other features) and ``compare`` is set.
    """
    record = registry.current_promoted(instrument_set)
    if record is None:
        return _Incumbent(None, None, "no promoted checkpoint for this instrument set")
    if not compare:
        return _Incumbent(None, None, f"not compared (--no-incumbent): promoted {record.sha256[:12]}")
    try:
        ckpt = checkpoint_from_bytes(store.get(record.sha256), expected_sha256=record.sha256)
        check_compatible(ckpt)
    except (CheckpointError, StorageError, BacktestError) as exc:
        raise IncumbentUnusable(record.sha256, instrument_set, str(exc)) from None
    return _Incumbent(ckpt, record.sha256, None)


@dataclass(frozen=True)
class _PendingFold:
    """A tested fold whose as-traded evaluations run beside the training."""

    index: int
    edges: tuple[int, int, int, int]
    test_from: str
    test_to: str
    sha256: str
    greedy: Rollout
    """The greedy one-contract diagnostic, taken when the fold was tested."""
    as_traded: Pending
    incumbent: Pending | None


class _Run:
    """The state of one run between its phases (see :func:`run_training`)."""

    def __init__(
        self,
        *,
        config: Config,
        request: TrainRequest,
        model_cfg: ModelConfig,
        xp: Any,
        bars: dict[str, InstrumentBars],
        specs: list[InstrumentSpec],
        folds: list[tuple[tuple[int, int, int, int], dict[str, tuple[int, int, int, int]]]],
        summary: TrainSummary,
        progress: Progress,
        current_floors: Mapping[str, Any],
        n_trials: int,
        runner: AsTradedRunner,
        incumbent: Checkpoint | None,
    ) -> None:
        self.config, self.request, self.model_cfg, self.xp = config, request, model_cfg, xp
        self.runner = runner
        """Runs the as-traded evaluations (worker processes, or this one)."""
        self.incumbent = incumbent
        """The incumbent to evaluate on the same blocks (verified before training), or None."""
        self.pending: list[_PendingFold] = []
        """Tested folds whose as-traded evaluations may still be running (:meth:`collect`)."""
        self.bars, self.specs, self.folds, self.summary = bars, specs, folds, summary
        self.progress = progress
        self.current_floors = current_floors
        """Learned floors as stored when the run started (symbol -> record or None)."""
        self.n_trials = n_trials
        """Retrains of this instrument set so far, this one included (the deflated Sharpe's N)."""
        self.curves = Curves()
        self.tests: list[tuple[tuple[int, int], dict[int, float], bytes]] = []
        """Per tested fold: its replay window [start, end) ns, the floors it was traded with and
        its checkpoint's bytes (stored at the end, :meth:`register`)."""
        self.kills: list[GateEvent] = []
        fused = xp is not np and fused_fits(model_cfg)
        params = init_params(model_cfg, np.random.default_rng(config.seed), xp=np if fused else xp)
        self.learner = select_learner(model_cfg, config.train, params, seed=config.seed, cuda=xp is not np)
        self.xp = self.learner.xp
        """The environments' array module (the host's for the fused CUDA learner)."""
        self.norm: FeatureNorm | None = None
        self.early_q_move = 0.0
        self.final_probe: tuple[float, float] = (0.0, 0.0)

    # training ---------------------------------------------------------------------------------

    def _env_data(
        self, parts: list[tuple[InstrumentBars, int, int]], norm: FeatureNorm, model: ModelConfig
    ) -> EnvData:
        """The environment over ``parts`` for a model of configuration ``model``, filling as the
        broker fills (``broker.fill_price``)."""
        return build_env_data(
            parts,
            norm,
            window=model.window,
            horizon=model.return_horizon,
            session_gap_s=self.config.train.session_gap_s,
            xp=self.xp,
            fill_price=self.config.broker.fill_price,
        )

    def train_all(self) -> None:
        cfg, s = self.config.train, self.summary
        self.progress.start("train", len(self.folds) * cfg.epochs * cfg.steps_per_epoch)
        self.progress.start("evaluate", len(self.folds))
        for index, (edges, per) in enumerate(self.folds):
            train_parts = [(self.bars[sym], a, e) for sym, (a, e, _, _) in per.items()]
            test_parts = [(self.bars[sym], st, t) for sym, (_, _, st, t) in per.items()]
            norm = fit_norm(train_parts)
            self.norm = norm  # the candidate's normalisation: that of the last fold trained
            data = self._env_data(train_parts, norm, self.model_cfg)
            log.info(
                "fold %d: training on %d decision bars, testing on %d instrument(s)",
                index,
                int(data.starts.shape[0]),
                len(test_parts),
            )
            fold_start = time.monotonic()
            result = train_fold(
                self.learner,
                data,
                cfg,
                fold=index,
                seed=self.config.seed,
                deadline=self.request.deadline,
                on_step=lambda: self.progress.advance("train"),
            )
            s.train_s += time.monotonic() - fold_start
            s.epochs.extend(result.epochs)
            s.gates.extend(result.drift_events)
            moves = [abs(e.q_mean - result.q_initial) for e in result.epochs[: cfg.early_epochs]]
            self.early_q_move = max(moves, default=0.0)
            if result.halted:
                s.halted = True
                s.halt_reason = result.drift_events[-1].message
                log.warning("fold %d: training halted: %s", index, s.halt_reason)
                return
            stats = probe_stats(self.learner, data, make_probe(data, cfg.probe_size))
            self.final_probe = (stats.q_spread, stats.entropy)
            self._test_fold(index, edges, norm, test_parts, self._fold_floors(per))

    def _fold_floors(self, per: dict[str, tuple[int, int, int, int]]) -> dict[int, float]:
        """The learned regime floors the fold's model would trade with: the stored floors moved
        towards the targets of this fold's training bars (for the last fold, exactly what
        :meth:`register` stores, and so what the daemon and a later backtest read)."""
        rate = self.config.regime.floor_rate
        ids = {spec.symbol: spec.instrument_id for spec in self.specs}
        out: dict[int, float] = {}
        for sym, target in self._floor_targets(per).items():
            previous = self.current_floors.get(sym)
            value = next_floor(float(previous.value) if previous is not None else None, target, rate)
            if value is not None:
                out[ids[sym]] = value
        return out

    def _fold_checkpoint(self, norm: FeatureNorm) -> bytes:
        """The model as it stands, as checkpoint bytes (what the fold's test evaluates)."""
        return checkpoint_to_bytes(
            self.learner.host_params(),
            self.model_cfg,
            feature_names=(*FEATURE_NAMES, *AGENT_FEATURES),
            norm_mean=norm.mean,
            norm_std=norm.std,
            metadata={"seed": self.config.seed, "instrument_set": self.summary.instrument_set},
        )

    def _test_fold(
        self,
        index: int,
        edges: tuple[int, int, int, int],
        norm: FeatureNorm,
        parts: list[tuple[InstrumentBars, int, int]],
        floors: dict[int, float],
    ) -> None:
        """Submit the fold's as-traded evaluations (the model, and the incumbent on the same
        block: the daemon's policy through ``tradeagent backtest``'s event-driven driver, on the
        trained instruments, starting flat with cold regime trackers over the learned floors,
        fills at arrival + latency, fees), then take the diagnostics that need the learner as it
        stands: the greedy one-contract rollout and the kill criteria."""
        cfg = self.config.train
        # The block's bounds as ISO strings and back: the window a user passes to `backtest`.
        test_from, test_to = ns_iso(edges[2]), ns_iso(edges[3] + 999)
        window = (parse_bound(test_from, "--from", end=False), parse_bound(test_to, "--to", end=True))
        blob = self._fold_checkpoint(norm)
        checkpoint = checkpoint_from_bytes(blob)
        self.tests.append((window, floors, blob))
        as_traded = self.runner.submit(checkpoint, floors, window)
        incumbent = None if self.incumbent is None else self.runner.submit(self.incumbent, floors, window)
        env = self._env_data(parts, norm, self.model_cfg)
        greedy = _evaluate(env, lambda obs, t: self.learner.greedy(obs), self.config)
        # "Did it learn?" asks the network, not the sizing: its greedy unit positions against
        # the random policy's in the same environment.
        random = _evaluate(env, baseline_policy("random", self.xp, self.config.seed + index), self.config)
        self.kills.extend(
            kill_criteria(
                fold_index=index,
                q_spread=self.final_probe[0],
                entropy=self.final_probe[1],
                early_q_move=self.early_q_move,
                candidate=greedy,
                random=random,
                model=self.model_cfg,
                config=cfg,
            )
        )
        self.pending.append(
            _PendingFold(index, edges, test_from, test_to, checkpoint.sha256, greedy, as_traded, incumbent)
        )

    def collect(self) -> None:
        """Wait for the tested folds' evaluations, in fold order: the as-traded books, the
        baselines and the incumbent's books into the curves, each fold into the summary."""
        s, bucket = self.summary, self.config.train.sharpe_bucket_s
        for p in self.pending:
            traded = p.as_traded.result()
            self.progress.advance("evaluate")
            books = traded.books
            self.curves.add("candidate", books)
            for name, base_books in traded.baselines.items():
                self.curves.add(name, base_books)
            self.curves.add("greedy_unit", p.greedy)
            greedy_mix = np.bincount(p.greedy.action, minlength=3) / max(p.greedy.action.shape[0], 1)
            mix = traded.summary.action_mix
            fold = FoldSummary(
                index=p.index,
                train_ns=(p.edges[0], p.edges[1]),
                test_ns=(p.edges[2], p.edges[3]),
                test_from=p.test_from,
                test_to=p.test_to,
                checkpoint_sha256=p.sha256,
                as_traded=_trading(books, bucket),
                greedy_unit=_trading(p.greedy, bucket),
                baselines={name: _trading(b, bucket) for name, b in traded.baselines.items()},
                as_traded_mix=[mix["short"], mix["flat"], mix["long"]],
                greedy_mix=greedy_mix.tolist(),
            )
            if p.incumbent is not None:
                incumbent_books = p.incumbent.result().books
                self.curves.add("incumbent", incumbent_books)
                fold = msgspec.structs.replace(fold, incumbent=_trading(incumbent_books, bucket))
            s.folds.append(fold)
            log.info(
                "fold %d, as traded: P&L %.2f, Sharpe %.2f, PSR %.3f (flat %.2f, random %.2f, long %.2f); "
                "greedy one contract: P&L %.2f",
                p.index,
                fold.as_traded.pnl,
                fold.as_traded.sharpe,
                fold.as_traded.psr,
                fold.baselines["flat"].pnl,
                fold.baselines["random"].pnl,
                fold.baselines["long"].pnl,
                fold.greedy_unit.pnl,
            )
        if "incumbent" in self.curves.records:
            s.incumbent_sharpe = self.curves.performance("incumbent", bucket).sharpe

    # gates ------------------------------------------------------------------------------------

    def decide(self) -> None:
        """Kill criteria (every fold) and the promotion bar on the as-traded out-of-sample
        record; the decision goes into the summary's ``gate``."""
        s, cfg = self.summary, self.config.train
        no_series = PnlSeries(pnl=np.zeros(0), ts_ns=np.zeros(0, np.int64))
        if not s.halted:
            s.oos = self.curves.performance("candidate", cfg.sharpe_bucket_s)
            s.oos_baselines = {name: self.curves.performance(name, cfg.sharpe_bucket_s) for name in BASELINES}
            s.oos_greedy_unit = self.curves.performance("greedy_unit", cfg.sharpe_bucket_s)
            s.gates.extend(self.kills)
        event = promotion(
            halted=s.halted,
            kills_passed=not s.halted and all(k.passed for k in self.kills),
            candidate=self.curves.series("candidate") if not s.halted else no_series,
            candidate_gross=self.curves.series("candidate", gross=True) if not s.halted else no_series,
            baselines={name: self.curves.series(name) for name in ("long", "random")} if not s.halted else {},
            incumbent=self.curves.series("incumbent") if "incumbent" in self.curves.records else None,
            max_drawdown=s.oos.max_drawdown if s.oos is not None else float("nan"),
            n_trials=self.n_trials,
            config=cfg,
        )
        s.gates.append(event)
        failed = [g.message for g in s.gates if not g.passed and g.kind != "promotion"]
        reasons = [*failed, *event.values["reasons"]]
        s.gate = GateDecision(passed=event.passed, reasons=reasons)

    # registry ---------------------------------------------------------------------------------

    def _floor_targets(
        self, per: dict[str, tuple[int, int, int, int]] | None = None
    ) -> dict[str, float | None]:
        """The floor targets of a fold's training bars (the last fold's by default)."""
        if per is None:
            if not self.folds:
                return {}
            _, per = self.folds[-1]
        regime: RegimeConfig = self.config.regime
        return {
            sym: floor_target(vol_ema_of(_log_returns(self.bars[sym], a, e), regime), regime.floor_quantile)
            for sym, (a, e, _, _) in per.items()
        }

    def _median_sq_returns(self) -> dict[str, float]:
        _, per = self.folds[-1]
        out = {}
        for sym, (a, e, _, _) in per.items():
            lr = _log_returns(self.bars[sym], a, e)
            out[sym] = float(np.median(lr**2)) if lr.size else 0.0
        return out

    def register(
        self,
        registry: ModelRegistry,
        floors_repo: LearnedFloors,
        store: CheckpointStore,
        current: dict[str, Any],
    ) -> None:
        s, cfg = self.summary, self.config.train
        run_id = registry.start_run(
            instrument_set=s.instrument_set,
            config={
                "train": msgspec.to_builtins(cfg),
                "model": msgspec.to_builtins(self.model_cfg),
                "seed": self.config.seed,
                "data": str(self.request.data),
            },
        )
        s.run_id = run_id
        for fold in s.folds:
            registry.record_fold(
                run_id,
                fold.index,
                train_ns=fold.train_ns,
                test_ns=fold.test_ns,
                metrics=_finite_json(msgspec.to_builtins(fold)),
            )
        for event in s.gates:
            registry.record_gate_event(
                run_id,
                event.kind,
                passed=event.passed,
                values=event.values,
                fold_index=event.fold_index,
                epoch=event.epoch,
                message=event.message,
            )
        decision = s.gates[-1]
        params = self.learner.host_params()
        if self.norm is not None and all(bool(np.isfinite(p).all()) for p in params.values()):
            blob = checkpoint_to_bytes(
                params,
                self.model_cfg,
                feature_names=(*FEATURE_NAMES, *AGENT_FEATURES),
                norm_mean=self.norm.mean,
                norm_std=self.norm.std,
                metadata=self._metadata(run_id),
            )
            sha = store.put(blob)
            s.candidate_sha256 = sha
            if sha == s.incumbent_sha256:
                # Byte-identical to the promoted model (same data, seed and code): nothing to decide.
                s.candidate_status = "incumbent"
            else:
                registry.register_candidate(
                    sha256=sha,
                    instrument_set=s.instrument_set,
                    layout_fingerprint=layout_fingerprint(param_shapes(self.model_cfg)),
                    path=str(store.path(sha)),
                    metrics=_candidate_metrics(s),
                    run_id=run_id,
                )
                if not decision.passed:
                    registry.reject(sha, reason=decision.message)
                    s.candidate_status = "rejected"
                elif self.request.promote:
                    registry.promote(sha, by=f"train run {run_id}")
                    s.candidate_status, s.promoted = "promoted", True
                else:
                    s.candidate_status = "candidate"
        for _, _, fold_blob in self.tests:  # each fold's evaluated model, for `backtest --checkpoint`
            store.put(fold_blob)
        self._update_floors(floors_repo, current, run_id)
        registry.finish_run(
            run_id, status="halted" if s.halted else "succeeded", summary=_candidate_metrics(s)
        )

    def _update_floors(self, floors_repo: LearnedFloors, current: dict[str, Any], run_id: int) -> None:
        regime = self.config.regime
        ids = {spec.symbol: spec.instrument_id for spec in self.specs}
        for sym, target in self._floor_targets().items():
            previous = current.get(sym)
            prev_value = float(previous.value) if previous is not None else None
            value = next_floor(prev_value, target, regime.floor_rate)
            if value is not None and value != prev_value:
                floors_repo.update(ids[sym], VOL_REF_FLOOR, value, run_id=run_id, source="train")
            self.summary.floors[sym] = {"previous": prev_value, "target": target, "value": value}

    def _metadata(self, run_id: int) -> dict[str, Any]:
        s, cfg = self.summary, self.config.train
        return {
            "run_id": run_id,
            "seed": self.config.seed,
            "instrument_set": s.instrument_set,
            "reward_scale": cfg.reward_scale,
            "upnl_clip": UPNL_CLIP,
            "bars": msgspec.to_builtins(self.config.feeds.bars),
            "oos_sharpe": s.oos.sharpe if s.oos else None,
            "regime_median_sq_return": self._median_sq_returns(),
            "folds": [[f.train_ns[0], f.train_ns[1], f.test_ns[0], f.test_ns[1]] for f in s.folds],
        }


def _candidate_metrics(s: TrainSummary) -> dict[str, Any]:
    """What the registry keeps of a run: the as-traded out-of-sample figures and the gate."""
    out: dict[str, Any] = _finite_json(
        {
            "oos": msgspec.to_builtins(s.oos) if s.oos else None,
            "oos_baselines": {k: v.sharpe for k, v in s.oos_baselines.items()},
            "fold_sharpe": [f.as_traded.sharpe for f in s.folds],
            "fold_psr": [f.as_traded.psr for f in s.folds],
            "gate": msgspec.to_builtins(s.gate) if s.gate else None,
            "incumbent_sharpe": s.incumbent_sharpe,
            "halted": s.halted,
            "halt_reason": s.halt_reason,
        }
    )
    return out


def _finite_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (stored JSON must be finite)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    return value


def _trading(books: PnlRecord, bucket_s: float) -> FoldTrading:
    """A policy's figures on one test block, with its probabilistic Sharpe against flat."""
    perf = performance(books.pnl, books.cost, books.traded, books.held, books.ts_ns, bucket_s=bucket_s)
    bucket = perf.bucket_s
    returns = (
        bucket_sums(books.pnl, books.ts_ns, max(1, round(bucket * 1e9))) if books.pnl.size else books.pnl
    )
    return FoldTrading.of(perf, probabilistic_sharpe(returns))
