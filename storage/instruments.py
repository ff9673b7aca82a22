"""The instruments table: what the ledger and the learned floors may refer to.

Thread-safety and retries as in :mod:`storage.journal`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage._sql import finite, insert_ignoring_conflicts, nonempty
from storage.database import Database
from storage.errors import InvalidRecord
from storage.tables import InstrumentRow, utc_now
from storage.values import InstrumentInfo

__all__ = ["Instruments"]


class Instruments:
    """Register and list instruments (keyed by Databento instrument id)."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def upsert(self, instruments: Sequence[InstrumentInfo]) -> None:
        """Insert new instruments and update tick size/value of known ones (one transaction).

        Safe when several processes register the same instruments at once. An id that changes
        symbol, or a symbol already used by another id, is refused with ``InvalidRecord``: the
        ledger's history would otherwise change meaning.
        """
        for info in instruments:
            nonempty(info.symbol, "instrument symbol", 64)
            if finite(info.tick_size, f"{info.symbol} tick_size") <= 0:
                raise InvalidRecord(f"instrument {info.symbol}: tick_size must be > 0")
            if finite(info.tick_value, f"{info.symbol} tick_value") <= 0:
                raise InvalidRecord(f"instrument {info.symbol}: tick_value must be > 0")

        def work(session: Session) -> None:
            rows = [
                {
                    "instrument_id": i.instrument_id,
                    "symbol": i.symbol,
                    "tick_size": i.tick_size,
                    "tick_value": i.tick_value,
                    "created_at": utc_now(),
                }
                for i in instruments
            ]
            insert_ignoring_conflicts(session, InstrumentRow, rows, ["instrument_id"])
            for info in instruments:
                row = session.get(InstrumentRow, info.instrument_id, with_for_update=True)
                if row is None or row.symbol != info.symbol:
                    raise InvalidRecord(
                        f"instrument id {info.instrument_id} is "
                        f"{row.symbol if row else 'missing'} in the database, not {info.symbol}"
                    )
                row.tick_size = info.tick_size
                row.tick_value = info.tick_value

        self._db.write(work, what="upsert instruments")

    def all(self) -> list[InstrumentInfo]:
        """Every registered instrument, by id."""

        def work(session: Session) -> list[InstrumentInfo]:
            rows = session.scalars(select(InstrumentRow).order_by(InstrumentRow.instrument_id))
            return [
                InstrumentInfo(
                    instrument_id=r.instrument_id,
                    symbol=r.symbol,
                    tick_size=r.tick_size,
                    tick_value=r.tick_value,
                )
                for r in rows
            ]

        return self._db.read(work, what="list instruments")
