from __future__ import annotations

import hashlib
import math
import threading

import pytest
from sqlalchemy import text

from storage import Database, Journal, ModelRegistry
from storage.errors import InvalidRecord, InvalidTransition, NotFound, PromotionConflict, StorageError
from storage.values import CheckpointRecord

SET = "ES,NQ"


def sha(i: int) -> str:
    return hashlib.sha256(f"checkpoint-{i}".encode()).hexdigest()


def candidate(registry: ModelRegistry, i: int, instrument_set: str = SET, run_id: int | None = None) -> str:
    registry.register_candidate(
        sha256=sha(i),
        instrument_set=instrument_set,
        layout_fingerprint="fp1",
        path=f"/ckpt/{sha(i)}",
        metrics={"sharpe": 1.0 + i},
        run_id=run_id,
    )
    return sha(i)


def test_runs_folds_and_gate_events_are_recorded(db: Database) -> None:
    registry = ModelRegistry(db)
    run = registry.start_run(instrument_set=SET, config={"folds": 2, "lr": 2.5e-4})
    assert registry.run_status(run) == "running"
    registry.record_fold(run, 0, train_ns=(0, 10), test_ns=(12, 20), metrics={"sharpe": 0.5})
    registry.record_fold(run, 0, train_ns=(0, 10), test_ns=(12, 20), metrics={"sharpe": 0.7})
    registry.record_fold(run, 1, train_ns=(10, 20), test_ns=(22, 30), metrics={"sharpe": 0.9})
    assert registry.fold_metrics(run) == {0: {"sharpe": 0.7}, 1: {"sharpe": 0.9}}
    registry.record_gate_event(
        run, "q_drift", passed=False, values={"q": 3.2, "q_prev": 1.1}, fold_index=1, epoch=4
    )
    events = registry.gate_events(run)
    assert [(e.kind, e.passed, e.values, e.fold_index, e.epoch) for e in events] == [
        ("q_drift", False, {"q": 3.2, "q_prev": 1.1}, 1, 4)
    ]
    registry.finish_run(run, status="halted", summary={"reason": "q_drift"})
    assert registry.run_status(run) == "halted"
    with pytest.raises(InvalidRecord, match="ordered"):
        registry.record_fold(run, 2, train_ns=(0, 10), test_ns=(5, 20), metrics={})
    with pytest.raises(InvalidRecord, match="finite"):
        registry.record_gate_event(run, "q_drift", passed=False, values={"q": math.nan})
    with pytest.raises(NotFound):
        registry.finish_run(run + 100, status="failed")


def test_candidate_registration_is_idempotent_and_validated(db: Database) -> None:
    registry = ModelRegistry(db)
    first = registry.register_candidate(
        sha256=sha(1), instrument_set=SET, layout_fingerprint="fp1", path="p", metrics={"sharpe": 1.0}
    )
    again = registry.register_candidate(
        sha256=sha(1), instrument_set=SET, layout_fingerprint="fp1", path="p", metrics={"sharpe": 1.0}
    )
    assert again == first and first.status == "candidate" and first.created_at.tzinfo is not None
    with pytest.raises(InvalidRecord, match="already registered"):
        registry.register_candidate(
            sha256=sha(1), instrument_set="ES", layout_fingerprint="fp1", path="p", metrics={}
        )
    with pytest.raises(InvalidRecord, match="sha256"):
        registry.register_candidate(
            sha256="XYZ", instrument_set=SET, layout_fingerprint="f", path="p", metrics={}
        )
    with pytest.raises(InvalidRecord, match="finite"):
        registry.register_candidate(
            sha256=sha(2), instrument_set=SET, layout_fingerprint="f", path="p", metrics={"sharpe": math.inf}
        )


def test_promote_retires_the_previous_and_writes_an_event(db: Database) -> None:
    registry = ModelRegistry(db)
    a, b = candidate(registry, 1), candidate(registry, 2)
    assert registry.current_promoted(SET) is None
    promoted_a = registry.promote(a, by="retrain")
    assert (promoted_a.status, promoted_a.promoted_by, promoted_a.replaced_sha256) == (
        "promoted",
        "retrain",
        None,
    )
    promoted_b = registry.promote(b, by="ops")
    assert promoted_b.replaced_sha256 == a
    assert registry.get(a).status == "retired" and registry.get(a).retired_at is not None
    current = registry.current_promoted(SET)
    assert current is not None and current.sha256 == b
    assert registry.promote(b, by="ops") == promoted_b  # a retried call is harmless
    events = Journal(db).events(kind="promotion")
    assert [e.details["sha256"] for e in events] == [a, b]
    assert events[1].details["replaced"] == a


def test_reject_and_invalid_transitions(db: Database) -> None:
    registry = ModelRegistry(db)
    a, b = candidate(registry, 1), candidate(registry, 2)
    rejected = registry.reject(a, reason="kill criterion: q_spread")
    assert (rejected.status, rejected.reject_reason) == ("rejected", "kill criterion: q_spread")
    assert registry.reject(a, reason="again").reject_reason == "kill criterion: q_spread"
    with pytest.raises(InvalidTransition, match="only a candidate can be promoted"):
        registry.promote(a, by="x")
    registry.promote(b, by="x")
    with pytest.raises(InvalidTransition, match="only a candidate can be rejected"):
        registry.reject(b, reason="late")
    with pytest.raises(NotFound):
        registry.promote(sha(99), by="x")
    assert len(Journal(db).events(kind="rejection")) == 1


def test_rollback_returns_to_the_previous_promoted(db: Database) -> None:
    registry = ModelRegistry(db)
    a, b, c = candidate(registry, 1), candidate(registry, 2), candidate(registry, 3)
    with pytest.raises(InvalidTransition, match="nothing is promoted"):
        registry.rollback(SET, by="ops", reason="x")
    registry.promote(a, by="t")
    with pytest.raises(InvalidTransition, match="no previous"):
        registry.rollback(SET, by="ops", reason="x")
    registry.promote(b, by="t")
    registry.promote(c, by="t")
    back = registry.rollback(SET, by="ops", reason="drawdown")
    assert back.sha256 == b and back.status == "promoted"
    assert registry.get(c).status == "rejected" and "drawdown" in (registry.get(c).reject_reason or "")
    assert registry.rollback(SET, by="ops", reason="still bad").sha256 == a
    assert [x.sha256 for x in registry.checkpoints(instrument_set=SET, status="promoted")] == [a]
    assert registry.referenced_hashes() == {a}
    assert [e.details["to"] for e in Journal(db).events(kind="rollback")] == [b, a]


def test_promotion_sets_are_independent(db: Database) -> None:
    registry = ModelRegistry(db)
    registry.promote(candidate(registry, 1, "ES"), by="t")
    registry.promote(candidate(registry, 2, "NQ"), by="t")
    assert {c.instrument_set for c in registry.checkpoints(status="promoted")} == {"ES", "NQ"}


def test_the_database_itself_refuses_a_second_promoted_checkpoint(db: Database) -> None:
    registry = ModelRegistry(db)
    a, b = candidate(registry, 1), candidate(registry, 2)
    registry.promote(a, by="t")
    with pytest.raises(StorageError, match="constraint"):
        db.write(
            lambda s: s.execute(
                text("UPDATE checkpoints SET status = 'promoted' WHERE sha256 = :h"), {"h": b}
            ),
            what="bypass the repository",
        )
    assert registry.get(b).status == "candidate"


def test_racing_promotions_leave_exactly_one_promoted(db: Database) -> None:
    registry = ModelRegistry(db)
    hashes = [candidate(registry, i) for i in range(8)]
    barrier = threading.Barrier(len(hashes))
    outcomes: dict[str, str] = {}

    def promote(h: str) -> None:
        barrier.wait()
        try:
            record: CheckpointRecord = registry.promote(h, by=f"racer-{h[:6]}")
            outcomes[h] = record.status
        except PromotionConflict:
            outcomes[h] = "conflict"

    threads = [threading.Thread(target=promote, args=(h,)) for h in hashes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(outcomes) == set(hashes)
    assert set(outcomes.values()) <= {"promoted", "conflict"}
    promoted = registry.checkpoints(instrument_set=SET, status="promoted")
    assert len(promoted) == 1
    winners = [h for h, outcome in outcomes.items() if outcome == "promoted"]
    assert promoted[0].sha256 in winners
    statuses = {c.sha256: c.status for c in registry.checkpoints(instrument_set=SET)}
    for h in hashes:
        expected = {"candidate"} if outcomes[h] == "conflict" else {"promoted", "retired"}
        assert statuses[h] in expected
    assert len(Journal(db).events(kind="promotion")) == len(winners)
