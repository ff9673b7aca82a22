"""Daemon leases on SQLite and PostgreSQL: one live session per account and instrument, a
stale or abandoned lease taken over (its session closed), renewal, release, and two sessions
racing for the same new leases."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import update

from storage import Database, Instruments, Journal, Leases
from storage.errors import LeaseHeld
from storage.leases import Gone
from storage.tables import DaemonLeaseRow, utc_now
from storage.values import LeasedSession, LeaseRecord
from tests.storage.conftest import ES, NQ, Target

IDS = [ES.instrument_id, NQ.instrument_id]


def _alive(_: LeaseRecord) -> bool:
    return False


def _start(
    db: Database, host: str, pid: int, ids: list[int] = IDS, *, account: str = "paper", gone: Gone = _alive
) -> LeasedSession:
    return Leases(db).start_session(
        account=account,
        instrument_ids=ids,
        mode="paper",
        host=host,
        pid=pid,
        version="t",
        stale_after_s=30,
        gone=gone,
    )


def _age(db: Database, seconds: float) -> None:
    """Move every heartbeat ``seconds`` into the past (as if the holder had stopped renewing)."""
    at = utc_now() - timedelta(seconds=seconds)
    db.write(lambda s: s.execute(update(DaemonLeaseRow).values(heartbeat_at=at)), what="age the leases")


def test_a_live_lease_refuses_another_session_and_names_its_holder(db: Database) -> None:
    first = _start(db, "box-a", 111)
    assert first.taken_over == ()
    for ids in (IDS, [NQ.instrument_id]):  # the same set, and one that overlaps it
        with pytest.raises(LeaseHeld, match=r"pid 111 on host box-a") as info:
            _start(db, "box-b", 222, ids)
        assert info.value.holder is not None and info.value.holder.session_id == first.session_id
    held = Leases(db).held("paper")
    assert [(h.instrument_id, h.session_id, h.host, h.pid) for h in held] == [
        (iid, first.session_id, "box-a", 111) for iid in IDS
    ]
    assert Journal(db).session(first.session_id).ended_at is None
    # Another account's instruments are not this account's leases.
    other = _start(db, "box-b", 222, account="other")
    assert other.taken_over == () and other.session_id != first.session_id


def test_a_stale_lease_is_taken_over_and_its_session_closed(db: Database) -> None:
    first = _start(db, "box-a", 111)
    _age(db, 60)
    second = _start(db, "box-b", 222)
    assert [(t.session_id, t.pid, t.host) for t in second.taken_over] == [(first.session_id, 111, "box-a")]
    closed = Journal(db).session(first.session_id)
    assert closed.ended_at is not None and closed.end_reason is not None
    assert closed.end_reason.startswith("not closed: no heartbeat for 60 s")
    assert f"daemon session {second.session_id}, pid 222 on host box-b" in closed.end_reason
    takeover = Journal(db).events(kind="takeover")
    assert [(e.session_id, e.details["previous_session"]) for e in takeover] == [
        (second.session_id, first.session_id)
    ]
    # The first holder, should it still run, learns at its next renewal that it must stop.
    with pytest.raises(LeaseHeld, match=r"lost its lease, now held by .*pid 222 on host box-b"):
        Leases(db).renew(first.session_id, account="paper", instrument_ids=IDS)
    before = {h.instrument_id: h.heartbeat_at for h in Leases(db).held()}
    _age(db, 5)
    Leases(db).renew(second.session_id, account="paper", instrument_ids=IDS)
    after = {h.instrument_id: h.heartbeat_at for h in Leases(db).held()}
    assert all(after[i] >= before[i] - timedelta(seconds=1) for i in IDS)
    Leases(db).end_session(second.session_id, reason="stopped")
    assert Leases(db).held() == []
    assert Journal(db).session(second.session_id).end_reason == "stopped"


def test_the_lease_of_a_process_gone_is_taken_over_at_once(db: Database) -> None:
    first = _start(db, "box-a", 111)

    def gone(lease: LeaseRecord) -> bool:
        return lease.host == "box-a" and lease.pid == 111

    second = _start(db, "box-a", 333, gone=gone)
    assert [t.session_id for t in second.taken_over] == [first.session_id]
    reason = Journal(db).session(first.session_id).end_reason
    assert reason is not None and reason.startswith("not closed: the process ended without a clean stop")
    # A session closed cleanly before is not closed again: it keeps its own reason.
    Leases(db).end_session(second.session_id, reason="stopped")
    third = _start(db, "box-a", 444)
    assert third.taken_over == ()
    assert Journal(db).session(second.session_id).end_reason == "stopped"


def test_two_sessions_racing_for_new_leases_one_wins(target: Target) -> None:
    """Two processes' worth of databases start at once: exactly one session gets the leases,
    the other is refused naming it (on PostgreSQL the loser may collide on the primary key and
    run its transaction again)."""
    with target.open() as setup:
        Instruments(setup).upsert([ES, NQ])
    barrier = threading.Barrier(2)
    outcomes: dict[int, LeasedSession | LeaseHeld] = {}

    def contender(pid: int) -> None:
        with target.open() as db:
            barrier.wait()
            try:
                outcomes[pid] = _start(db, f"box-{pid}", pid)
            except LeaseHeld as exc:
                outcomes[pid] = exc

    threads = [threading.Thread(target=contender, args=(pid,)) for pid in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    winners = [pid for pid, o in outcomes.items() if isinstance(o, LeasedSession)]
    losers = [o for o in outcomes.values() if isinstance(o, LeaseHeld)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert f"pid {winners[0]} on host box-{winners[0]}" in str(losers[0])
