"""A run and the model registry: the incumbent read before training, the results written after.

:func:`load_incumbent` loads and verifies the promoted checkpoint of the instrument set before
any training, so an unusable one stops the run at once. :func:`register` runs last, after the
gate: it records the run, its folds and every gate event with its numbers, writes the candidate
(the last fold's model) to the checkpoint store and registers it, then promotes it (one
transaction) or rejects it, stores each fold's evaluated model (``tradeagent backtest
--checkpoint``) and moves the learned floors towards this archive's targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from agent.backtest.errors import BacktestError
from agent.backtest.inputs import check_compatible
from agent.model import layout_fingerprint, param_shapes
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes, checkpoint_to_bytes
from agent.model.errors import CheckpointError
from agent.policy.floors import VOL_REF_FLOOR, next_floor
from agent.policy.observation import AGENT_FEATURES, UPNL_CLIP
from agent.train.errors import IncumbentUnusable
from agent.train.fold_floors import floor_targets, median_sq_returns, stored_value
from agent.train.gates import GateEvent
from agent.train.phases import Run
from agent.train.summary import TrainSummary
from feeds.features import FEATURE_NAMES
from storage import CheckpointStore, LearnedFloors, ModelRegistry
from storage.errors import StorageError

__all__ = ["Incumbent", "load_incumbent", "register"]


@dataclass(frozen=True)
class Incumbent:
    """The incumbent of a run: the verified checkpoint to compare with (None: none), the
    promoted hash when it is compared, and the summary's note."""

    checkpoint: Checkpoint | None
    sha256: str | None
    note: str | None


def load_incumbent(
    registry: ModelRegistry, store: CheckpointStore, instrument_set: str, *, compare: bool
) -> Incumbent:
    """Load and verify the promoted checkpoint of ``instrument_set`` (before any training).

    Raises :class:`IncumbentUnusable` when it cannot be traded by this code (stored file missing,
    unreadable or corrupt, wrong layout fingerprint, other features) and ``compare`` is set.
    """
    record = registry.current_promoted(instrument_set)
    if record is None:
        return Incumbent(None, None, "no promoted checkpoint for this instrument set")
    if not compare:
        return Incumbent(None, None, f"not compared (--no-incumbent): promoted {record.sha256[:12]}")
    try:
        ckpt = checkpoint_from_bytes(store.get(record.sha256), expected_sha256=record.sha256)
        check_compatible(ckpt)
    except (CheckpointError, StorageError, BacktestError) as exc:
        raise IncumbentUnusable(record.sha256, instrument_set, str(exc)) from None
    return Incumbent(ckpt, record.sha256, None)


def register(
    run: Run,
    registry: ModelRegistry,
    floors_repo: LearnedFloors,
    store: CheckpointStore,
    *,
    data: Path,
    promote: bool,
) -> None:
    """Write the decided run (see the module docstring); ``data`` is the archive it trained on,
    ``promote`` whether a candidate that passed every gate is promoted."""
    s = run.summary
    run_id = _record_run(run, registry, data)
    _store_candidate(run, registry, store, run_id, s.gates[-1], promote=promote)
    for _, _, fold_blob in run.tests:  # each fold's evaluated model, for `backtest --checkpoint`
        store.put(fold_blob)
    _update_floors(run, floors_repo, run_id)
    registry.finish_run(run_id, status="halted" if s.halted else "succeeded", summary=_candidate_metrics(s))


def _record_run(run: Run, registry: ModelRegistry, data: Path) -> int:
    """Start the run's registry record with its folds and every gate event; its id."""
    s = run.summary
    run_id = registry.start_run(
        instrument_set=s.instrument_set,
        config={
            "train": msgspec.to_builtins(run.config.train),
            "model": msgspec.to_builtins(run.model_cfg),
            "seed": run.config.seed,
            "data": str(data),
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
    return run_id


def _store_candidate(
    run: Run,
    registry: ModelRegistry,
    store: CheckpointStore,
    run_id: int,
    decision: GateEvent,
    *,
    promote: bool,
) -> None:
    """Write the candidate (the last fold's model, when its parameters are finite) to the store,
    register it and promote or reject it by ``decision``."""
    s = run.summary
    params = run.learner.host_params()
    if run.norm is None or not all(bool(np.isfinite(p).all()) for p in params.values()):
        return
    blob = checkpoint_to_bytes(
        params,
        run.model_cfg,
        feature_names=(*FEATURE_NAMES, *AGENT_FEATURES),
        norm_mean=run.norm.mean,
        norm_std=run.norm.std,
        metadata=_metadata(run, run_id),
    )
    sha = store.put(blob)
    s.candidate_sha256 = sha
    if sha == s.incumbent_sha256:
        # Byte-identical to the promoted model (same data, seed and code): nothing to decide.
        s.candidate_status = "incumbent"
        return
    registry.register_candidate(
        sha256=sha,
        instrument_set=s.instrument_set,
        layout_fingerprint=layout_fingerprint(param_shapes(run.model_cfg)),
        path=str(store.path(sha)),
        metrics=_candidate_metrics(s),
        run_id=run_id,
    )
    if not decision.passed:
        registry.reject(sha, reason=decision.message)
        s.candidate_status = "rejected"
    elif promote:
        registry.promote(sha, by=f"train run {run_id}")
        s.candidate_status, s.promoted = "promoted", True
    else:
        s.candidate_status = "candidate"


def _last_fold_targets(run: Run) -> dict[str, float | None]:
    """The floor targets of the last fold's training bars (none without a fold)."""
    if not run.folds:
        return {}
    _, per = run.folds[-1]
    return floor_targets(run.bars, per, run.config.regime)


def _update_floors(run: Run, floors_repo: LearnedFloors, run_id: int) -> None:
    """Move each stored floor towards the last fold's target (what that fold's model was traded
    with) and note previous, target and new value in the summary."""
    rate = run.config.regime.floor_rate
    for sym, target in _last_fold_targets(run).items():
        prev_value = stored_value(run.current_floors.get(sym))
        value = next_floor(prev_value, target, rate)
        if value is not None and value != prev_value:
            floors_repo.update(run.instrument_ids[sym], VOL_REF_FLOOR, value, run_id=run_id, source="train")
        run.summary.floors[sym] = {"previous": prev_value, "target": target, "value": value}


def _metadata(run: Run, run_id: int) -> dict[str, Any]:
    """The candidate checkpoint's metadata."""
    s, cfg = run.summary, run.config.train
    _, last = run.folds[-1]
    return {
        "run_id": run_id,
        "seed": run.config.seed,
        "instrument_set": s.instrument_set,
        "reward_scale": cfg.reward_scale,
        "upnl_clip": UPNL_CLIP,
        "bars": msgspec.to_builtins(run.config.feeds.bars),
        "oos_sharpe": s.oos.sharpe if s.oos else None,
        "regime_median_sq_return": median_sq_returns(run.bars, last),
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
