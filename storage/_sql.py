"""Small shared helpers of the repositories: dialect-specific upserts and input validation."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from storage.errors import InvalidRecord
from storage.tables import Base

__all__ = ["finite", "insert_ignoring_conflicts", "json_document", "nonempty"]


def insert_ignoring_conflicts(
    session: Session,
    model: type[Base],
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    returning: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """``INSERT ... ON CONFLICT (keys) DO NOTHING`` of ``rows``; return ``returning`` of new rows.

    One statement for the whole batch (executemany with RETURNING on SQLite >= 3.35 and
    PostgreSQL); rows whose key already exists, also those inserted concurrently by another
    transaction, are skipped without error. ``keys`` must be a unique constraint of ``model``.
    """
    if not rows:
        return []
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(model).on_conflict_do_nothing(index_elements=list(keys))
    if not returning:
        session.execute(statement, list(rows))
        return []
    columns = [getattr(model, name) for name in returning]
    return [tuple(row) for row in session.execute(statement.returning(*columns), list(rows))]


def json_document(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """``value`` as a JSON object; NaN/Inf and non-JSON types are refused with InvalidRecord."""
    if value is None:
        return {}
    try:
        return dict(json.loads(json.dumps(dict(value), allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"{what}: not a finite JSON object: {exc}") from None


def finite(value: float, what: str) -> float:
    """``value`` as a float, refusing NaN and infinities."""
    number = float(value)
    if not math.isfinite(number):
        raise InvalidRecord(f"{what}: must be finite, got {value!r}")
    return number


def nonempty(value: str, what: str, max_len: int) -> str:
    """A stripped, non-empty string of at most ``max_len`` characters."""
    text = value.strip()
    if not text or len(text) > max_len:
        raise InvalidRecord(f"{what}: must be 1..{max_len} characters, got {value!r}")
    return text
