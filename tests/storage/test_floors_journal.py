from __future__ import annotations

import math

import pytest

from storage import Database, Instruments, Journal, LearnedFloors, ModelRegistry
from storage.errors import InvalidRecord, NotFound
from storage.values import InstrumentInfo


def test_floor_updates_keep_history_and_provenance(db: Database) -> None:
    floors = LearnedFloors(db)
    run = ModelRegistry(db).start_run(instrument_set="ES", config={})
    assert floors.get(1001, "vol_ref") is None
    floors.update(1001, "vol_ref", 1e-8, source="seed")
    current = floors.update(1001, "vol_ref", 2.5e-8, run_id=run)
    assert (current.value, current.run_id, current.source) == (2.5e-8, run, "train")
    floors.update(1002, "vol_ref", 3e-8, run_id=run)
    history = floors.history(1001, "vol_ref")
    assert [(h.value, h.previous_value, h.run_id, h.source) for h in history] == [
        (1e-8, None, None, "seed"),
        (2.5e-8, 1e-8, run, "train"),
    ]
    assert set(floors.all("vol_ref")) == {(1001, "vol_ref"), (1002, "vol_ref")}
    assert floors.get(1001, "vol_ref") == current


@pytest.mark.parametrize(
    ("instrument", "value", "run_id", "message"),
    [
        (1001, math.nan, None, "finite"),
        (1001, -1.0, None, ">= 0"),
        (4242, 1.0, None, "constraint"),
        (1001, 1.0, 999, "constraint"),
    ],
)
def test_bad_floor_updates_are_refused(
    db: Database, instrument: int, value: float, run_id: int | None, message: str
) -> None:
    floors = LearnedFloors(db)
    with pytest.raises(InvalidRecord, match=message):
        floors.update(instrument, "vol_ref", value, run_id=run_id)
    assert floors.all() == {}


def test_instruments_upsert_is_idempotent_and_refuses_renames(db: Database) -> None:
    instruments = Instruments(db)
    instruments.upsert([InstrumentInfo(instrument_id=1001, symbol="ES", tick_size=0.25, tick_value=12.5)])
    assert [i.symbol for i in instruments.all()] == ["ES", "NQ"]
    with pytest.raises(InvalidRecord, match="not ESM"):
        instruments.upsert(
            [InstrumentInfo(instrument_id=1001, symbol="ESM", tick_size=0.25, tick_value=12.5)]
        )
    with pytest.raises(InvalidRecord):
        instruments.upsert([InstrumentInfo(instrument_id=7, symbol="ES", tick_size=0.25, tick_value=12.5)])
    with pytest.raises(InvalidRecord, match="tick_size"):
        instruments.upsert([InstrumentInfo(instrument_id=8, symbol="CL", tick_size=0.0, tick_value=10.0)])


def test_sessions_and_events(db: Database) -> None:
    journal = Journal(db)
    session = journal.start_session(mode="paper", host="box", pid=123, version="0.1.0")
    gap = journal.record_event(
        "gap", "sequence gap on ES", session_id=session, instrument_id=1001, details={"missing": 3}
    )
    journal.record_event("halt", "daily loss limit", session_id=session)
    journal.end_session(session, reason="SIGTERM")
    journal.end_session(session, reason="second call keeps the first")
    events = journal.events()
    assert [(e.kind, e.session_id) for e in events] == [("gap", session), ("halt", session)]
    assert events[0].id == gap and events[0].details == {"missing": 3} and events[0].instrument_id == 1001
    assert [e.kind for e in journal.events(after_id=gap)] == ["halt"]
    with pytest.raises(InvalidRecord, match="finite"):
        journal.record_event("gap", "x", details={"v": math.inf})
    with pytest.raises(InvalidRecord):
        journal.record_event("", "no kind")
    with pytest.raises(NotFound):
        journal.end_session(session + 50, reason="x")
