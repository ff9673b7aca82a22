"""Daemon leases: at most one live daemon session trades an account's instrument.

A row per (account, instrument) names the session that holds it (host, pid) and when it last
renewed its heartbeat. The rules:

* :meth:`Leases.start_session` starts a daemon session and takes the leases of all its
  instruments in one transaction. It refuses with :class:`LeaseHeld` (naming the holder's pid
  and host) while any of them is held by a **live** session: one whose heartbeat is younger
  than ``stale_after_s`` and whose process the caller's ``gone`` check does not declare ended
  (the daemon checks the pids of its own host). Two daemons sharing one database, on one host
  or on several, never trade the same instruments of one account at once.
* A lease left by a session that did not stop cleanly (its process gone, or its heartbeat
  stale) is taken over: that session is closed, if still open, with the reason, and a
  ``takeover`` event is journaled.
* :meth:`Leases.renew` renews the heartbeat; it raises :class:`LeaseHeld` when another session
  took a lease over meanwhile (this one was stale): its holder must stop trading.
* :meth:`Leases.end_session` is the clean stop: the leases are released and the session ended
  in one transaction.

Clock: heartbeats are stamped with the database's clock on PostgreSQL (``now()``), so hosts
whose clocks disagree still agree on staleness; an SQLite file lives on one host, whose clock
it uses. Concurrency: PostgreSQL locks the existing rows (``FOR UPDATE``); two sessions
creating the same new lease at once collide on its primary key, and the loser's transaction
is run again, to find the winner's lease. SQLite serialises writers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage.database import Database
from storage.errors import InvalidRecord, LeaseHeld, StorageError
from storage.journal import add_event, add_session, close_session
from storage.tables import DaemonLeaseRow, utc_now
from storage.values import LeasedSession, LeaseRecord

__all__ = ["Gone", "Leases"]

Gone = Callable[[LeaseRecord], bool]
"""The caller's check that a lease's holder process has ended (e.g. a pid of this host that no
longer exists); a lease whose holder is gone may be taken over at once."""


class _Collision(StorageError):
    """Another session inserted the same new lease first (the transaction is run again)."""


def _never(_: LeaseRecord) -> bool:
    return False


def _now(session: Session) -> datetime:
    if session.get_bind().dialect.name == "postgresql":
        value: datetime = session.execute(select(func.now())).scalar_one()
        return value.astimezone(UTC)
    return utc_now()


def _record(row: DaemonLeaseRow) -> LeaseRecord:
    return LeaseRecord(
        account=row.account,
        instrument_id=row.instrument_id,
        session_id=row.session_id,
        host=row.host,
        pid=row.pid,
        acquired_at=row.acquired_at,
        heartbeat_at=row.heartbeat_at,
    )


def _age_s(lease: LeaseRecord, now: datetime) -> float:
    return max(0.0, (now - lease.heartbeat_at).total_seconds())


def _holder(lease: LeaseRecord) -> str:
    return f"daemon session {lease.session_id} (pid {lease.pid} on host {lease.host})"


def _locked(session: Session, account: str, ids: Sequence[int]) -> dict[int, DaemonLeaseRow]:
    query = (
        select(DaemonLeaseRow)
        .where(DaemonLeaseRow.account == account, DaemonLeaseRow.instrument_id.in_(ids))
        .order_by(DaemonLeaseRow.instrument_id)
        .with_for_update()
    )
    return {row.instrument_id: row for row in session.scalars(query)}


class Leases:
    """The daemon leases of one database."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def start_session(
        self,
        *,
        account: str,
        instrument_ids: Sequence[int],
        mode: str,
        host: str,
        pid: int,
        version: str,
        stale_after_s: float,
        gone: Gone = _never,
    ) -> LeasedSession:
        """Start a daemon session holding the leases of ``instrument_ids`` for ``account``.

        Raises :class:`LeaseHeld` (nothing written) while a live session holds any of them.
        """
        ids = sorted(set(instrument_ids))
        if not ids:
            raise InvalidRecord("a daemon session needs at least one instrument to lease")

        def work(session: Session) -> LeasedSession:
            now = _now(session)
            rows = _locked(session, account, ids)
            previous: dict[int, tuple[LeaseRecord, str]] = {}
            for row in rows.values():
                lease = _record(row)
                if gone(lease):
                    why = "the process ended without a clean stop"
                elif _age_s(lease, now) >= stale_after_s:
                    why = f"no heartbeat for {_age_s(lease, now):.0f} s"
                else:
                    raise LeaseHeld(
                        f"account {account!r}, instrument {lease.instrument_id}: leased to "
                        f"{_holder(lease)}, last heartbeat {_age_s(lease, now):.0f} s ago",
                        holder=lease,
                    )
                previous.setdefault(lease.session_id, (lease, why))
            session_id = add_session(session, mode=mode, host=host, pid=pid, version=version)
            for lease, why in previous.values():
                _take_over(session, lease, why, session_id, f"pid {pid} on host {host}")
            for iid in ids:
                row = rows.get(iid) or DaemonLeaseRow(account=account, instrument_id=iid)
                row.session_id, row.host, row.pid = session_id, host[:255], pid
                row.acquired_at = row.heartbeat_at = now
                session.add(row)
            session.flush()
            return LeasedSession(session_id=session_id, taken_over=tuple(p for p, _ in previous.values()))

        try:
            return self._db.write(work, what="start daemon session", on_integrity=_collided)
        except _Collision:
            return self._db.write(work, what="start daemon session")

    def renew(self, session_id: int, *, account: str, instrument_ids: Sequence[int]) -> None:
        """Renew the heartbeat of the session's leases; :class:`LeaseHeld` when any of them is
        no longer the session's (another session took it over: this one must stop trading)."""
        ids = sorted(set(instrument_ids))

        def work(session: Session) -> None:
            now = _now(session)
            rows = _locked(session, account, ids)
            for iid in ids:
                row = rows.get(iid)
                if row is None or row.session_id != session_id:
                    lease = _record(row) if row is not None else None
                    whose = _holder(lease) if lease is not None else "nobody (the row was removed)"
                    raise LeaseHeld(
                        f"account {account!r}, instrument {iid}: daemon session {session_id} lost its "
                        f"lease, now held by {whose}",
                        holder=lease,
                    )
                row.heartbeat_at = now

        self._db.write(work, what="renew daemon leases")

    def end_session(self, session_id: int, *, reason: str) -> None:
        """The clean stop: release the session's leases and end it, in one transaction."""

        def work(session: Session) -> None:
            session.execute(delete(DaemonLeaseRow).where(DaemonLeaseRow.session_id == session_id))
            close_session(session, session_id, reason=reason)

        self._db.write(work, what="end daemon session")

    def held(self, account: str | None = None) -> list[LeaseRecord]:
        """The leases held now (of one account, or all), by account and instrument."""

        def work(session: Session) -> list[LeaseRecord]:
            query = select(DaemonLeaseRow).order_by(DaemonLeaseRow.account, DaemonLeaseRow.instrument_id)
            if account is not None:
                query = query.where(DaemonLeaseRow.account == account)
            return [_record(row) for row in session.scalars(query)]

        return self._db.read(work, what="read daemon leases")


def _take_over(session: Session, lease: LeaseRecord, why: str, new_session: int, new_holder: str) -> None:
    """Close the previous holder's session (if still open) and journal the takeover."""
    reason = f"not closed: {why} (its leases taken over by daemon session {new_session}, {new_holder})"
    close_session(session, lease.session_id, reason=reason)
    add_event(
        session,
        "takeover",
        f"{_holder(lease)} did not stop cleanly ({why}); its leases taken over",
        session_id=new_session,
        details={"previous_session": lease.session_id, "host": lease.host, "pid": lease.pid},
    )


def _collided(exc: IntegrityError) -> StorageError:
    return _Collision(str(exc.orig))
