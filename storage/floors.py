"""Learned floors: per-instrument values the system learns and must remember across runs.

The regime scale's ``vol_ref`` floor is the first (ALGORITHMS.md section 4); others are
added by name. The current value lives in ``learned_floors``; every change is appended to
``learned_floor_history`` with the previous value, the run that produced it and its source
(``train``, ``manual``, ``seed``...). The trainer writes, the trainer and the daemon read at
start.

Thread-safety and retries as in :mod:`storage.journal`. Updates of the same floor from two
processes serialise on the row; the history records each with the value it replaced.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage._sql import finite, insert_ignoring_conflicts, nonempty
from storage.database import Database
from storage.errors import InvalidRecord
from storage.tables import LearnedFloorChangeRow, LearnedFloorRow, utc_now
from storage.values import FloorChange, FloorValue

__all__ = ["LearnedFloors"]


def _value(row: LearnedFloorRow) -> FloorValue:
    return FloorValue(
        instrument_id=row.instrument_id,
        name=row.name,
        value=row.value,
        run_id=row.run_id,
        source=row.source,
        updated_at=row.updated_at,
    )


class LearnedFloors:
    """Read and update learned floors, keeping their full history."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def get(self, instrument_id: int, name: str) -> FloorValue | None:
        """The current value of one floor, or None if it was never set."""

        def work(session: Session) -> FloorValue | None:
            row = session.get(LearnedFloorRow, (instrument_id, name))
            return _value(row) if row is not None else None

        return self._db.read(work, what="read learned floor")

    def all(self, name: str | None = None) -> dict[tuple[int, str], FloorValue]:
        """Every current floor (optionally of one name), by (instrument_id, name)."""

        def work(session: Session) -> dict[tuple[int, str], FloorValue]:
            query = select(LearnedFloorRow)
            if name is not None:
                query = query.where(LearnedFloorRow.name == name)
            return {(r.instrument_id, r.name): _value(r) for r in session.scalars(query)}

        return self._db.read(work, what="read learned floors")

    def update(
        self, instrument_id: int, name: str, value: float, *, run_id: int | None = None, source: str = "train"
    ) -> FloorValue:
        """Set a floor (finite, >= 0) and append the change to its history; return the new value.

        ``run_id`` is the train run that produced the value (provenance); unknown instrument or
        run: ``InvalidRecord``.
        """
        key = nonempty(name, "floor name", 64)
        origin = nonempty(source, "floor source", 64)
        number = finite(value, f"floor {key} of instrument {instrument_id}")
        if number < 0:
            raise InvalidRecord(f"floor {key} of instrument {instrument_id}: must be >= 0, got {value}")

        def work(session: Session) -> FloorValue:
            now = utc_now()
            fresh = insert_ignoring_conflicts(
                session,
                LearnedFloorRow,
                [
                    {
                        "instrument_id": instrument_id,
                        "name": key,
                        "value": number,
                        "run_id": run_id,
                        "source": origin,
                        "updated_at": now,
                    }
                ],
                ["instrument_id", "name"],
                ["name"],
            )
            row = session.get(
                LearnedFloorRow, (instrument_id, key), with_for_update=True, populate_existing=True
            )
            if row is None:
                raise InvalidRecord(f"floor {key} of instrument {instrument_id} could not be stored")
            previous = None if fresh else row.value
            row.value, row.run_id, row.source, row.updated_at = number, run_id, origin, now
            session.add(
                LearnedFloorChangeRow(
                    instrument_id=instrument_id,
                    name=key,
                    value=number,
                    previous_value=previous,
                    run_id=run_id,
                    source=origin,
                    created_at=now,
                )
            )
            session.flush()
            return _value(row)

        return self._db.write(work, what=f"update learned floor {key}")

    def history(self, instrument_id: int, name: str) -> list[FloorChange]:
        """Every value the floor took, oldest first, with the run that produced it."""

        def work(session: Session) -> list[FloorChange]:
            rows = session.scalars(
                select(LearnedFloorChangeRow)
                .where(
                    LearnedFloorChangeRow.instrument_id == instrument_id, LearnedFloorChangeRow.name == name
                )
                .order_by(LearnedFloorChangeRow.id)
            )
            return [
                FloorChange(
                    instrument_id=r.instrument_id,
                    name=r.name,
                    value=r.value,
                    previous_value=r.previous_value,
                    run_id=r.run_id,
                    source=r.source,
                    created_at=r.created_at,
                )
                for r in rows
            ]

        return self._db.read(work, what="read learned floor history")
