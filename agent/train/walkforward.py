"""One training run, end to end: archive -> walk-forward folds -> gates -> registry.

Order of work (nothing is registered before the end, so a crash or a timeout leaves the
registry, the promoted model and the learned floors as they were):

1. load the archive into per-instrument bars (:mod:`agent.train.data`);
2. plan rolling folds on the timeline of the instrument with the most bars, map them to every
   instrument by time and purge training bars closer than the gap to the test block
   (:mod:`agent.train.folds`);
3. per fold: fit the normalisation on the training bars only, train (the parameters carry over
   from the previous fold, the optimiser, target network and replay are fresh), check Q-drift
   after every epoch, then evaluate the greedy policy and the baselines on the test block
   (:mod:`agent.train.phases`);
4. re-evaluate the incumbent (the promoted checkpoint of this instrument set) on the same test
   blocks with its own normalisation. It is loaded and verified (stored file, sha256, layout,
   features) before step 1: an unusable incumbent stops the run at once with
   :class:`IncumbentUnusable` (the message says how to fix it), never after the training
   (:func:`agent.train.registration.load_incumbent`);
   ``TrainRequest(incumbent=False)`` (``train --no-incumbent``) compares with no incumbent;
5. kill criteria and the promotion gate on the concatenated out-of-sample record;
6. the candidate is the last fold's model (trained on the most recent window, with its own
   out-of-sample block): written to the checkpoint store (tmp-then-rename), registered, then
   promoted (one transaction) or rejected; the learned floors move towards this archive's
   targets; every gate event and fold is stored with its numbers
   (:func:`agent.train.registration.register`).

The summary and the curves it returns are :mod:`agent.train.summary`'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from threadpoolctl import threadpool_limits

from agent.config import Config
from agent.gpu.backend import Backend, select_backend
from agent.policy.floors import VOL_REF_FLOOR
from agent.policy.observation import AGENT_FEATURES
from agent.progress import SILENT, Progress
from agent.train.data import load_archive, select_instruments
from agent.train.env import InstrumentBars
from agent.train.errors import TrainError, TrainTimeout
from agent.train.evaluate import AsTradedRunner, eval_workers
from agent.train.folds import fold_ranges, gap_bars
from agent.train.gates import drift_floor
from agent.train.phases import Run
from agent.train.registration import load_incumbent, register
from agent.train.summary import RunResult, TrainSummary
from feeds.config import InstrumentSpec
from feeds.dbn import dbn_files
from feeds.features import FEATURE_NAMES
from storage import CheckpointStore, Instruments, LearnedFloors, ModelRegistry, open_database
from storage.values import InstrumentInfo

__all__ = ["TrainRequest", "run_training"]


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


def _load_bars(
    config: Config, request: TrainRequest, specs: list[InstrumentSpec], progress: Progress
) -> dict[str, InstrumentBars]:
    """The bars of ``specs``: the request's preloaded ones, or computed from the archive."""
    if request.bars is not None:
        missing = [spec.symbol for spec in specs if spec.symbol not in request.bars]
        if missing:
            raise TrainError(f"preloaded bars lack instrument(s) {', '.join(missing)}")
        return {spec.symbol: request.bars[spec.symbol] for spec in specs}
    progress.start("load", len(dbn_files(request.data)))
    return load_archive(
        request.data,
        config.feeds,
        specs,
        fee_per_contract=config.broker.fee_per_contract,
        latency_ms=config.broker.latency_ms,
        close_grace_ns=config.daemon.close_grace_ns,
        on_file=lambda _f: progress.advance("load"),
    )


def _run_training(config: Config, request: TrainRequest, progress: Progress, backend: Backend) -> RunResult:
    started = time.monotonic()
    cfg = config.train
    specs = select_instruments(config.feeds, request.instruments)
    instrument_set = ",".join(sorted(s.symbol for s in specs))
    database = open_database(config.storage, config.data_dir)
    try:
        registry = ModelRegistry(database)
        store = CheckpointStore.for_data_dir(config.data_dir)
        incumbent = load_incumbent(registry, store, instrument_set, compare=request.incumbent)
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
        bars = _load_bars(config, request, specs, progress)
        model_cfg = config.model.with_features(len(FEATURE_NAMES) + len(AGENT_FEATURES))
        folds = fold_ranges(bars, cfg, config.model.window, gap_bars(model_cfg, cfg))
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
        jobs = len(folds) * (3 if incumbent.checkpoint is not None else 2)  # model, baselines, incumbent
        with AsTradedRunner(
            trade_config, request.data, workers=eval_workers(cfg.eval_workers, jobs)
        ) as runner:
            run = Run(
                config=config,
                deadline=request.deadline,
                model_cfg=model_cfg,
                xp=backend.xp,
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
        register(run, registry, floors_repo, store, data=request.data, promote=request.promote)
        summary.wall_s = time.monotonic() - started
        return RunResult(summary, run.curves)
    finally:
        database.close()
