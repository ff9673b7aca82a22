"""The phases of one training run over its planned folds (:class:`Run`).

:meth:`Run.train_all` trains fold after fold (the parameters carry over from the previous fold;
the optimiser, target network and replay are fresh), checking Q-drift after every epoch, and
tests each fold as it finishes: the fold's as-traded evaluations (its model and the incumbent,
through ``tradeagent backtest``'s event-driven driver) are submitted to run beside the training,
the greedy one-contract diagnostic and the kill criteria are taken at once. :meth:`Run.collect`
waits for the evaluations in fold order and fills the summary and the curves;
:meth:`Run.decide` applies the kill criteria and the promotion gate to the concatenated
out-of-sample record. Nothing here writes the registry (:mod:`agent.train.registration`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from agent.backtest.api import BacktestResult, Books
from agent.backtest.inputs import ns_iso, parse_bound
from agent.config import Config
from agent.model import ModelConfig, init_params
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes, checkpoint_to_bytes
from agent.policy.observation import AGENT_FEATURES
from agent.progress import Progress
from agent.trading.decider import BASELINES
from agent.train.baselines import baseline_policy
from agent.train.config import TrainConfig
from agent.train.cuda_learner import fused_fits, select_learner
from agent.train.env import EnvData, FeatureNorm, InstrumentBars, Rollout, build_env_data, fit_norm, rollout
from agent.train.evaluate import AsTradedRunner, Pending
from agent.train.fold_floors import floor_targets, fold_floors
from agent.train.folds import Bounds, MappedFold
from agent.train.gates import GateEvent, PnlSeries, kill_criteria, promotion
from agent.train.summary import Curves, FoldSummary, GateDecision, TrainSummary, fold_trading
from agent.train.trainer import make_probe, probe_stats, train_fold
from feeds.config import InstrumentSpec
from feeds.features import FEATURE_NAMES
from storage.values import FloorValue

__all__ = ["PendingFold", "Run"]

log = logging.getLogger(__name__)


def _evaluate(data: EnvData, policy: Any, config: TrainConfig) -> Rollout:
    return rollout(data, policy, n_envs=config.eval_envs, reward_scale=config.reward_scale)


@dataclass(frozen=True)
class PendingFold:
    """A tested fold whose as-traded evaluations run beside the training."""

    index: int
    edges: Bounds
    test_from: str
    test_to: str
    sha256: str
    greedy: Rollout
    """The greedy one-contract diagnostic, taken when the fold was tested."""
    as_traded: Pending[BacktestResult]
    baselines: Pending[dict[str, Books]]
    incumbent: Pending[BacktestResult] | None


class Run:
    """The state of one run between its phases (see :mod:`agent.train.walkforward`)."""

    def __init__(
        self,
        *,
        config: Config,
        deadline: float | None,
        model_cfg: ModelConfig,
        xp: Any,
        bars: dict[str, InstrumentBars],
        specs: list[InstrumentSpec],
        folds: list[MappedFold],
        summary: TrainSummary,
        progress: Progress,
        current_floors: Mapping[str, FloorValue | None],
        n_trials: int,
        runner: AsTradedRunner,
        incumbent: Checkpoint | None,
    ) -> None:
        self.config, self.model_cfg, self.xp = config, model_cfg, xp
        self.deadline = deadline
        """``time.monotonic()`` value after which the training stops (:class:`TrainTimeout`)."""
        self.runner = runner
        """Runs the as-traded evaluations (worker processes, or this one)."""
        self.incumbent = incumbent
        """The incumbent to evaluate on the same blocks (verified before training), or None."""
        self.pending: list[PendingFold] = []
        """Tested folds whose as-traded evaluations may still be running (:meth:`collect`)."""
        self.bars, self.folds, self.summary = bars, folds, summary
        self.instrument_ids = {spec.symbol: spec.instrument_id for spec in specs}
        """Symbol -> instrument id of the trained instruments."""
        self.progress = progress
        self.current_floors = current_floors
        """Learned floors as stored when the run started (symbol -> record or None)."""
        self.n_trials = n_trials
        """Retrains of this instrument set so far, this one included (the deflated Sharpe's N)."""
        self.curves = Curves()
        self.tests: list[tuple[tuple[int, int], dict[int, float], bytes]] = []
        """Per tested fold: its replay window [start, end) ns, the floors it was traded with and
        its checkpoint's bytes (stored at the end, :func:`agent.train.registration.register`)."""
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
        """Train fold after fold and test each as it finishes; a halt stops the training there
        (the summary says why)."""
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
                deadline=self.deadline,
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

    def _fold_floors(self, per: dict[str, Bounds]) -> dict[int, float]:
        """The learned regime floors the fold's model would trade with: the stored floors moved
        towards the targets of this fold's training bars (for the last fold, exactly what
        :func:`agent.train.registration.register` stores, and so what the daemon and a later
        backtest read)."""
        regime = self.config.regime
        return fold_floors(
            floor_targets(self.bars, per, regime), self.current_floors, regime.floor_rate, self.instrument_ids
        )

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
        edges: Bounds,
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
        baselines = self.runner.submit_baselines(window)
        incumbent = None if self.incumbent is None else self.runner.submit(self.incumbent, floors, window)
        env = self._env_data(parts, norm, self.model_cfg)
        greedy = _evaluate(env, lambda obs, t: self.learner.greedy(obs), cfg)
        # "Did it learn?" asks the network, not the sizing: its greedy unit positions against
        # the random policy's in the same environment.
        random = _evaluate(env, baseline_policy("random", self.xp, self.config.seed + index), cfg)
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
            PendingFold(
                index, edges, test_from, test_to, checkpoint.sha256, greedy, as_traded, baselines, incumbent
            )
        )

    def collect(self) -> None:
        """Wait for the tested folds' evaluations, in fold order: the as-traded books, the
        baselines and the incumbent's books into the curves, each fold into the summary."""
        s, bucket = self.summary, self.config.train.sharpe_bucket_s
        for p in self.pending:
            traded = p.as_traded.result()
            baselines = p.baselines.result()
            self.progress.advance("evaluate")
            books = traded.books
            self.curves.add("candidate", books)
            for name, base_books in baselines.items():
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
                as_traded=fold_trading(books, bucket),
                greedy_unit=fold_trading(p.greedy, bucket),
                baselines={name: fold_trading(b, bucket) for name, b in baselines.items()},
                as_traded_mix=[mix["short"], mix["flat"], mix["long"]],
                greedy_mix=greedy_mix.tolist(),
            )
            if p.incumbent is not None:
                incumbent_books = p.incumbent.result().books
                self.curves.add("incumbent", incumbent_books)
                fold = msgspec.structs.replace(fold, incumbent=fold_trading(incumbent_books, bucket))
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
