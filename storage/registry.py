"""The model registry: train runs, folds, gate events and the checkpoint life cycle.

Checkpoint life cycle (one row per sha256)::

    candidate --promote--> promoted --(next promotion)--> retired --(rollback)--> promoted
        |                      |
        +--reject--> rejected  +--rollback--> rejected (reason recorded)

At most one checkpoint per instrument set is ``promoted``; the database enforces it with a
partial unique index, so of two racing promotions exactly one commits and the other gets
``PromotionConflict`` with nothing changed. ``promote``, ``reject`` and ``rollback`` each run
in one transaction that also writes an event (kinds ``promotion``, ``rejection``,
``rollback``).

Every method is safe from any thread (blocking; use a worker thread in asyncio code) and
retries transient failures until ``retry_deadline_s``. The bytes of a checkpoint live in
:class:`storage.checkpoints.CheckpointStore`; the registry keeps their hash and path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage._sql import json_document, nonempty
from storage.database import Database
from storage.errors import InvalidRecord, InvalidTransition, NotFound, PromotionConflict, StorageError
from storage.journal import add_event
from storage.tables import CheckpointRow, FoldRow, GateEventRow, TrainRunRow, utc_now
from storage.values import CheckpointRecord, CheckpointStatus, GateEventRecord, RunStatus

__all__ = ["ModelRegistry"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _check_sha(sha256: str) -> str:
    if not _SHA256.match(sha256):
        raise InvalidRecord(f"not a lower-case hex sha256: {sha256!r}")
    return sha256


def _record(row: CheckpointRow, replaced_sha: str | None) -> CheckpointRecord:
    return CheckpointRecord(
        id=row.id,
        sha256=row.sha256,
        instrument_set=row.instrument_set,
        layout_fingerprint=row.layout_fingerprint,
        path=row.path,
        metrics=row.metrics,
        status=cast(CheckpointStatus, row.status),
        run_id=row.run_id,
        created_at=row.created_at,
        promoted_at=row.promoted_at,
        promoted_by=row.promoted_by,
        retired_at=row.retired_at,
        reject_reason=row.reject_reason,
        replaced_sha256=replaced_sha,
    )


def _to_record(session: Session, row: CheckpointRow) -> CheckpointRecord:
    replaced = session.get(CheckpointRow, row.replaced_id) if row.replaced_id is not None else None
    return _record(row, replaced.sha256 if replaced is not None else None)


def _locked(session: Session, sha256: str) -> CheckpointRow:
    row = session.scalar(
        select(CheckpointRow).where(CheckpointRow.sha256 == _check_sha(sha256)).with_for_update()
    )
    if row is None:
        raise NotFound(f"no checkpoint {sha256}")
    return row


def _promoted(session: Session, instrument_set: str) -> CheckpointRow | None:
    return session.scalar(
        select(CheckpointRow)
        .where(CheckpointRow.instrument_set == instrument_set, CheckpointRow.status == "promoted")
        .with_for_update()
    )


class ModelRegistry:
    """Train runs, folds, gate events and checkpoints of every instrument set."""

    def __init__(self, database: Database) -> None:
        self._db = database

    # runs, folds, gates ---------------------------------------------------------------------

    def start_run(self, *, instrument_set: str, config: Mapping[str, Any]) -> int:
        """Record the start of a train run (``config``: JSON object of its settings); return its id."""
        document = json_document(config, "train run config")
        key = nonempty(instrument_set, "instrument_set", 512)

        def work(session: Session) -> int:
            row = TrainRunRow(instrument_set=key, status="running", config=document)
            session.add(row)
            session.flush()
            return row.id

        return self._db.write(work, what="start train run")

    def finish_run(
        self,
        run_id: int,
        *,
        status: RunStatus,
        summary: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Record how a run ended (succeeded, failed, halted) with its summary metrics."""
        if status == "running":
            raise InvalidRecord("finish_run needs a final status (succeeded, failed, halted)")
        document = json_document(summary, "train run summary")

        def work(session: Session) -> None:
            row = session.get(TrainRunRow, run_id, with_for_update=True)
            if row is None:
                raise NotFound(f"no train run {run_id}")
            row.status, row.summary, row.error, row.finished_at = status, document, error, utc_now()

        self._db.write(work, what="finish train run")

    def count_runs(self, instrument_set: str) -> int:
        """Train runs recorded for ``instrument_set`` (any status): the number of trials a new
        candidate's significance is deflated for."""
        key = nonempty(instrument_set, "instrument_set", 512)

        def work(session: Session) -> int:
            return len(session.scalars(select(TrainRunRow.id).where(TrainRunRow.instrument_set == key)).all())

        return self._db.read(work, what="count train runs")

    def run_status(self, run_id: int) -> RunStatus:
        """The status of a run."""

        def work(session: Session) -> RunStatus:
            row = session.get(TrainRunRow, run_id)
            if row is None:
                raise NotFound(f"no train run {run_id}")
            return cast(RunStatus, row.status)

        return self._db.read(work, what="read train run")

    def record_fold(
        self,
        run_id: int,
        fold_index: int,
        *,
        train_ns: tuple[int, int],
        test_ns: tuple[int, int],
        metrics: Mapping[str, Any],
    ) -> int:
        """Record one walk-forward fold (spans ``[start, end)`` in ns) and its test metrics.

        Idempotent per ``(run_id, fold_index)``: recording a fold again replaces its metrics.
        """
        if not (train_ns[0] < train_ns[1] <= test_ns[0] < test_ns[1]):
            raise InvalidRecord(
                f"fold {fold_index}: spans must be ordered train < test, got {train_ns} {test_ns}"
            )
        document = json_document(metrics, f"fold {fold_index} metrics")

        def work(session: Session) -> int:
            row = session.scalar(
                select(FoldRow)
                .where(FoldRow.run_id == run_id, FoldRow.fold_index == fold_index)
                .with_for_update()
            )
            if row is None:
                row = FoldRow(run_id=run_id, fold_index=fold_index)
                session.add(row)
            row.train_start_ns, row.train_end_ns = train_ns
            row.test_start_ns, row.test_end_ns = test_ns
            row.metrics = document
            session.flush()
            return row.id

        return self._db.write(work, what="record fold")

    def fold_metrics(self, run_id: int) -> dict[int, dict[str, Any]]:
        """Test metrics of each fold of a run, by fold index."""

        def work(session: Session) -> dict[int, dict[str, Any]]:
            rows = session.scalars(
                select(FoldRow).where(FoldRow.run_id == run_id).order_by(FoldRow.fold_index)
            )
            return {r.fold_index: r.metrics for r in rows}

        return self._db.read(work, what="read folds")

    def record_gate_event(
        self,
        run_id: int,
        kind: str,
        *,
        passed: bool,
        values: Mapping[str, Any],
        fold_index: int | None = None,
        epoch: int | None = None,
        message: str = "",
    ) -> int:
        """Record a gate evaluation (``kind`` e.g. ``q_drift``, ``kill_q_spread``) and its numbers."""
        document = json_document(values, f"gate event {kind!r} values")
        name = nonempty(kind, "gate kind", 64)

        def work(session: Session) -> int:
            row = GateEventRow(
                run_id=run_id,
                kind=name,
                passed=passed,
                values=document,
                fold_index=fold_index,
                epoch=epoch,
                message=message,
            )
            session.add(row)
            session.flush()
            return row.id

        return self._db.write(work, what="record gate event")

    def gate_events(self, run_id: int) -> list[GateEventRecord]:
        """Gate events of a run, oldest first."""

        def work(session: Session) -> list[GateEventRecord]:
            rows = session.scalars(
                select(GateEventRow).where(GateEventRow.run_id == run_id).order_by(GateEventRow.id)
            )
            return [
                GateEventRecord(
                    id=r.id,
                    run_id=r.run_id,
                    kind=r.kind,
                    passed=r.passed,
                    values=r.values,
                    fold_index=r.fold_index,
                    epoch=r.epoch,
                    message=r.message,
                    created_at=r.created_at,
                )
                for r in rows
            ]

        return self._db.read(work, what="read gate events")

    # checkpoints ----------------------------------------------------------------------------

    def register_candidate(
        self,
        *,
        sha256: str,
        instrument_set: str,
        layout_fingerprint: str,
        path: str,
        metrics: Mapping[str, Any],
        run_id: int | None = None,
    ) -> CheckpointRecord:
        """Register a checkpoint (already in the file store) as a candidate; return it.

        Idempotent: registering the same sha256 again with the same instrument set and
        fingerprint returns the stored row unchanged (whatever its status now).
        """
        _check_sha(sha256)
        key = nonempty(instrument_set, "instrument_set", 512)
        fingerprint = nonempty(layout_fingerprint, "layout_fingerprint", 128)
        document = json_document(metrics, f"checkpoint {sha256[:12]} metrics")

        def work(session: Session) -> CheckpointRecord:
            row = session.scalar(select(CheckpointRow).where(CheckpointRow.sha256 == sha256))
            if row is None:
                row = CheckpointRow(
                    sha256=sha256,
                    instrument_set=key,
                    layout_fingerprint=fingerprint,
                    path=path,
                    metrics=document,
                    status="candidate",
                    run_id=run_id,
                )
                session.add(row)
                session.flush()
            elif (row.instrument_set, row.layout_fingerprint) != (key, fingerprint):
                raise InvalidRecord(
                    f"checkpoint {sha256[:12]} is already registered for {row.instrument_set} "
                    f"with fingerprint {row.layout_fingerprint}"
                )
            return _to_record(session, row)

        return self._db.write(work, what="register candidate")

    def promote(self, sha256: str, *, by: str, session_id: int | None = None) -> CheckpointRecord:
        """Make a candidate the promoted checkpoint of its instrument set (one transaction).

        The previously promoted one becomes ``retired`` (kept for rollback) and an event of
        kind ``promotion`` is written. Promoting the checkpoint that is already promoted
        returns it unchanged (a retried call is harmless). Raises ``InvalidTransition`` for a
        checkpoint that is not a candidate, ``PromotionConflict`` when a concurrent promotion
        for the same set committed first.
        """
        who = nonempty(by, "promoted_by", 128)

        def work(session: Session) -> CheckpointRecord:
            row = _locked(session, sha256)
            if row.status == "promoted":
                return _to_record(session, row)
            if row.status != "candidate":
                raise InvalidTransition(
                    f"checkpoint {sha256[:12]} is {row.status}, only a candidate can be promoted"
                )
            previous = _promoted(session, row.instrument_set)
            now = utc_now()
            if previous is not None:
                previous.status, previous.retired_at = "retired", now
                session.flush()
            row.status, row.promoted_at, row.promoted_by = "promoted", now, who
            row.replaced_id = previous.id if previous is not None else None
            session.flush()
            add_event(
                session,
                "promotion",
                f"checkpoint {sha256[:12]} promoted for {row.instrument_set} by {who}",
                session_id=session_id,
                checkpoint_id=row.id,
                details={"sha256": sha256, "replaced": previous.sha256 if previous else None, "by": who},
            )
            return _record(row, previous.sha256 if previous else None)

        return self._db.write(work, what="promote checkpoint", on_integrity=self._conflict(sha256))

    def reject(self, sha256: str, *, reason: str, session_id: int | None = None) -> CheckpointRecord:
        """Reject a candidate with a reason (an event of kind ``rejection`` is written).

        Rejecting an already rejected checkpoint returns it unchanged.
        """
        why = nonempty(reason, "reject reason", 10_000)

        def work(session: Session) -> CheckpointRecord:
            row = _locked(session, sha256)
            if row.status == "rejected":
                return _to_record(session, row)
            if row.status != "candidate":
                raise InvalidTransition(
                    f"checkpoint {sha256[:12]} is {row.status}: only a candidate can be rejected "
                    "(roll back a promoted one)"
                )
            row.status, row.reject_reason = "rejected", why
            add_event(
                session,
                "rejection",
                f"checkpoint {sha256[:12]} rejected: {why}",
                session_id=session_id,
                checkpoint_id=row.id,
                details={"sha256": sha256, "reason": why},
            )
            return _to_record(session, row)

        return self._db.write(work, what="reject checkpoint")

    def rollback(
        self, instrument_set: str, *, by: str, reason: str, session_id: int | None = None
    ) -> CheckpointRecord:
        """Put the previous promoted checkpoint of ``instrument_set`` back; return it.

        The current one becomes ``rejected`` with ``reject_reason = "rolled back by ...:
        reason"`` (it is judged bad and will not come back by a later rollback); the target is
        the most recent retired checkpoint in its chain of replacements. One transaction, with
        an event of kind ``rollback``. ``InvalidTransition`` when nothing is promoted or there
        is no previous checkpoint to return to.
        """
        who = nonempty(by, "rollback by", 128)

        def work(session: Session) -> CheckpointRecord:
            current = _promoted(session, instrument_set)
            if current is None:
                raise InvalidTransition(f"nothing is promoted for {instrument_set}: nothing to roll back")
            target = self._rollback_target(session, current)
            now = utc_now()
            current.status, current.retired_at = "rejected", now
            current.reject_reason = f"rolled back by {who}: {reason}"
            session.flush()
            target.status, target.promoted_at, target.promoted_by, target.retired_at = (
                "promoted",
                now,
                who,
                None,
            )
            session.flush()
            add_event(
                session,
                "rollback",
                f"{instrument_set}: rolled back from {current.sha256[:12]} "
                f"to {target.sha256[:12]} by {who}: {reason}",
                session_id=session_id,
                checkpoint_id=target.id,
                details={"from": current.sha256, "to": target.sha256, "by": who, "reason": reason},
            )
            return _to_record(session, target)

        return self._db.write(work, what="roll back checkpoint", on_integrity=self._conflict(instrument_set))

    @staticmethod
    def _rollback_target(session: Session, current: CheckpointRow) -> CheckpointRow:
        seen = {current.id}
        candidate_id = current.replaced_id
        while candidate_id is not None and candidate_id not in seen:
            seen.add(candidate_id)
            row = session.get(CheckpointRow, candidate_id, with_for_update=True)
            if row is None:
                break
            if row.status == "retired":
                return row
            candidate_id = row.replaced_id
        raise InvalidTransition(
            f"{current.instrument_set}: no previous promoted checkpoint "
            f"to roll back to from {current.sha256[:12]}"
        )

    @staticmethod
    def _conflict(what: str) -> Callable[[IntegrityError], StorageError]:
        def build(exc: IntegrityError) -> StorageError:
            if "one_promoted_per_set" in str(exc.orig) or "checkpoints.instrument_set" in str(exc.orig):
                return PromotionConflict(f"{what}: a concurrent promotion for the same instrument set won")
            return InvalidRecord(f"{what}: refused by a database constraint: {str(exc.orig).splitlines()[0]}")

        return build

    def current_promoted(self, instrument_set: str) -> CheckpointRecord | None:
        """The promoted checkpoint of ``instrument_set``, or None."""

        def work(session: Session) -> CheckpointRecord | None:
            row = session.scalar(
                select(CheckpointRow).where(
                    CheckpointRow.instrument_set == instrument_set, CheckpointRow.status == "promoted"
                )
            )
            return _to_record(session, row) if row is not None else None

        return self._db.read(work, what="read promoted checkpoint")

    def get(self, sha256: str) -> CheckpointRecord:
        """One checkpoint by hash (``NotFound`` if unknown)."""

        def work(session: Session) -> CheckpointRecord:
            row = session.scalar(select(CheckpointRow).where(CheckpointRow.sha256 == _check_sha(sha256)))
            if row is None:
                raise NotFound(f"no checkpoint {sha256}")
            return _to_record(session, row)

        return self._db.read(work, what="read checkpoint")

    def checkpoints(
        self, *, instrument_set: str | None = None, status: CheckpointStatus | None = None
    ) -> list[CheckpointRecord]:
        """Checkpoints, oldest first, optionally filtered by instrument set and status."""

        def work(session: Session) -> list[CheckpointRecord]:
            query = select(CheckpointRow).order_by(CheckpointRow.id)
            if instrument_set is not None:
                query = query.where(CheckpointRow.instrument_set == instrument_set)
            if status is not None:
                query = query.where(CheckpointRow.status == status)
            rows = list(session.scalars(query))
            by_id = {r.id: r.sha256 for r in session.scalars(select(CheckpointRow))} if rows else {}
            return [_record(r, by_id.get(r.replaced_id) if r.replaced_id else None) for r in rows]

        return self._db.read(work, what="list checkpoints")

    def referenced_hashes(self) -> set[str]:
        """Hashes whose files must be kept (candidate, promoted, retired); see ``CheckpointStore.purge``."""

        def work(session: Session) -> set[str]:
            return set(
                session.scalars(select(CheckpointRow.sha256).where(CheckpointRow.status != "rejected"))
            )

        return self._db.read(work, what="list referenced checkpoints")
