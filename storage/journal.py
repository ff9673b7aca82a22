"""Daemon sessions and the operator timeline (events: halts, gaps, reconnects, swaps...).

Every method runs one transaction through :class:`storage.database.Database` and is safe to
call from any thread (blocking: call it from a worker thread in asyncio code). Writes are
retried on transient failures until ``retry_deadline_s``, then raise ``DatabaseUnavailable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage._sql import json_document, nonempty
from storage.database import Database
from storage.errors import NotFound
from storage.tables import DaemonSessionRow, EventRow, utc_now
from storage.values import EventRecord, SessionRecord

__all__ = ["Journal", "add_event", "add_session", "close_session"]


def add_event(
    session: Session,
    kind: str,
    message: str,
    *,
    session_id: int | None = None,
    instrument_id: int | None = None,
    checkpoint_id: int | None = None,
    details: Mapping[str, Any] | None = None,
) -> EventRow:
    """Add an event row inside the caller's transaction (used by the other repositories)."""
    event = EventRow(
        kind=nonempty(kind, "event kind", 32),
        message=message,
        session_id=session_id,
        instrument_id=instrument_id,
        checkpoint_id=checkpoint_id,
        details=json_document(details, f"event {kind!r} details"),
    )
    session.add(event)
    session.flush()
    return event


def add_session(session: Session, *, mode: str, host: str, pid: int, version: str) -> int:
    """Add a daemon session row inside the caller's transaction; return its id."""
    row = DaemonSessionRow(
        mode=nonempty(mode, "session mode", 16),
        host=host[:255],
        pid=pid,
        version=nonempty(version, "session version", 64),
    )
    session.add(row)
    session.flush()
    return row.id


def close_session(session: Session, session_id: int, *, reason: str) -> bool:
    """End a session inside the caller's transaction; True when it was still open (an ended
    session keeps its first end time and reason)."""
    row = session.get(DaemonSessionRow, session_id, with_for_update=True, populate_existing=True)
    if row is None:
        raise NotFound(f"no daemon session {session_id}")
    if row.ended_at is not None:
        return False
    row.ended_at = utc_now()
    row.end_reason = reason
    return True


def _session_record(row: DaemonSessionRow) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        mode=row.mode,
        host=row.host,
        pid=row.pid,
        version=row.version,
        started_at=row.started_at,
        ended_at=row.ended_at,
        end_reason=row.end_reason,
    )


def _event_record(row: EventRow) -> EventRecord:
    return EventRecord(
        id=row.id,
        kind=row.kind,
        message=row.message,
        created_at=row.created_at,
        session_id=row.session_id,
        instrument_id=row.instrument_id,
        checkpoint_id=row.checkpoint_id,
        details=row.details,
    )


class Journal:
    """Sessions of the daemon and the event timeline."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def start_session(self, *, mode: str, host: str, pid: int, version: str) -> int:
        """Record the start of a session (``mode``: live, paper, backtest); return its id. The
        trading daemon starts its sessions through ``Leases.start_session`` instead."""
        return self._db.write(
            lambda s: add_session(s, mode=mode, host=host, pid=pid, version=version), what="start session"
        )

    def end_session(self, session_id: int, *, reason: str) -> None:
        """Mark a session ended (idempotent: a second call keeps the first end time)."""
        self._db.write(lambda s: close_session(s, session_id, reason=reason), what="end session")

    def session(self, session_id: int) -> SessionRecord:
        """One session; raises ``NotFound``."""

        def work(session: Session) -> SessionRecord:
            row = session.get(DaemonSessionRow, session_id)
            if row is None:
                raise NotFound(f"no daemon session {session_id}")
            return _session_record(row)

        return self._db.read(work, what="read session")

    def record_event(
        self,
        kind: str,
        message: str,
        *,
        session_id: int | None = None,
        instrument_id: int | None = None,
        checkpoint_id: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> int:
        """Append an event (``kind`` e.g. halt, resume, gap, reconnect, swap); return its id.

        ``details`` must be a JSON object of finite numbers, strings, lists and objects.
        """
        return self._db.write(
            lambda s: (
                add_event(
                    s,
                    kind,
                    message,
                    session_id=session_id,
                    instrument_id=instrument_id,
                    checkpoint_id=checkpoint_id,
                    details=details,
                ).id
            ),
            what=f"record event {kind!r}",
        )

    def events(self, *, kind: str | None = None, after_id: int = 0, limit: int = 1000) -> list[EventRecord]:
        """Events with ``id > after_id`` (oldest first), optionally of one kind."""

        def work(session: Session) -> list[EventRecord]:
            query = select(EventRow).where(EventRow.id > after_id).order_by(EventRow.id).limit(limit)
            if kind is not None:
                query = query.where(EventRow.kind == kind)
            return [_event_record(row) for row in session.scalars(query)]

        return self._db.read(work, what="read events")
