"""What every source yields: batches of MBP-10 records and health events, plus its counters.

A source is an async iterator of :data:`SourceEvent` values. A :class:`RecordBatch` carries a
NumPy structured array of :data:`feeds.records.MBP10_DTYPE` records (never a Python object per
record); a :class:`HealthEvent` reports what happened to the transport (a gap, a disconnect, a
reconnect, a stale feed, rejected bytes, dropped records, records that do not match the
configuration, or time going back) with counts and timestamps, so that the book and the daemon
can mark instruments untradable and log the episode.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from feeds.records import MBP10_DTYPE

__all__ = ["BatchPart", "HealthEvent", "HealthKind", "RecordBatch", "SourceCounters", "SourceEvent"]


@dataclasses.dataclass(frozen=True, slots=True)
class BatchPart:
    """Piece ``number`` of a publisher batch cut into ``parts`` messages (one per instrument and
    size limit), all published back to back. Reassembled and sorted by ``ts_recv``, the pieces
    give the publisher's batch in global ``ts_recv`` order (what the recorder writes)."""

    publisher: str
    batch: int
    parts: int


@dataclasses.dataclass(frozen=True, slots=True)
class RecordBatch:
    """A run of MBP-10 records in arrival order.

    ``records`` has dtype :data:`MBP10_DTYPE`, shape ``(n,)``, ``n >= 1``; it may be a read-only
    view of the transport buffer, so copy it before writing to it. ``received_ns`` is the local
    wall clock (UNIX ns) when the batch was taken from the transport. ``transport_seq`` is the
    transport's own sequence number for the batch (the JetStream stream sequence of the NATS
    message) or ``None`` where the transport has none. ``part`` says, when the publisher
    tells, that this batch is one piece of a larger publisher batch (see :class:`BatchPart`).
    """

    records: np.ndarray
    received_ns: int
    transport_seq: int | None = None
    part: BatchPart | None = None

    def __post_init__(self) -> None:
        if self.records.dtype != MBP10_DTYPE or self.records.ndim != 1:
            raise ValueError(f"RecordBatch needs a 1-D MBP10_DTYPE array, got {self.records.dtype}")

    def __len__(self) -> int:
        return int(self.records.shape[0])


class HealthKind(enum.StrEnum):
    """What a :class:`HealthEvent` reports."""

    DISCONNECTED = "disconnected"
    """The transport went away; records may be missing until ``RECONNECTED``."""
    RECONNECTED = "reconnected"
    """The transport is back and every subscription was re-established."""
    GAP = "gap"
    """Records are known or likely to be missing (a transport sequence gap or an outage)."""
    STALE = "stale"
    """No record for longer than the configured stale interval."""
    REJECTED = "rejected"
    """Bytes that were not valid MBP-10 DBN were counted and thrown away."""
    DROPPED = "dropped"
    """Valid records were dropped because the consumer fell behind (bounded queue full)."""
    MISMATCH = "mismatch"
    """The feed does not match the configuration: records of another dataset or of an instrument
    that is not configured were counted and thrown away (never traded), or, while this feed is
    stale, the stream holds other datasets' or symbols' messages and none of this feed's. Once
    per dataset or instrument (or stale episode); the detail names both sides and the remedy."""
    TIME_REGRESSION = "time_regression"
    """An instrument's ``ts_recv`` went back behind the latest one seen (a feed replayed from an
    earlier point, a restarted publisher): reported at the first such record, once per episode
    (the episode ends with the first record at or after that latest time)."""


@dataclasses.dataclass(frozen=True, slots=True)
class HealthEvent:
    """One health episode of a source (never dropped, unlike record batches).

    ``at_ns`` is the local wall clock (UNIX ns) of the event. ``count`` is the number of things
    concerned: messages for ``REJECTED`` (``bytes`` gives their size), records for ``DROPPED``,
    missing transport messages for ``GAP`` when known (else 0). ``disconnected_at_ns`` and
    ``reconnected_at_ns`` bound an outage for ``RECONNECTED``/``GAP`` events; ``MISMATCH``
    counts the refused records and ``TIME_REGRESSION`` the records of the batch behind the
    instrument's latest time (``instrument_id`` names it for both when one instrument is
    concerned). ``detail`` is a
    short human-readable explanation (never contains credentials).
    """

    kind: HealthKind
    at_ns: int
    detail: str = ""
    count: int = 0
    bytes: int = 0
    disconnected_at_ns: int | None = None
    reconnected_at_ns: int | None = None
    sequence_gap: int | None = None
    """Transport sequence numbers skipped (``None`` when the transport cannot tell)."""
    instrument_id: int | None = None
    """The instrument concerned, when the event is about one."""


SourceEvent = RecordBatch | HealthEvent


@dataclasses.dataclass(slots=True)
class SourceCounters:
    """Running totals of one source since it was created (monotonic; read them any time)."""

    batches: int = 0
    records: int = 0
    messages: int = 0
    """Transport messages received (NATS messages; records for per-record transports)."""
    bytes: int = 0
    rejected_messages: int = 0
    rejected_bytes: int = 0
    rejected_dataset_records: int = 0
    """Records of another dataset (NATS subject, DBN file metadata): counted, never passed on."""
    rejected_instrument_records: int = 0
    """Records of an instrument that is not configured (or, on NATS, of a symbol not subscribed):
    counted, never passed on."""
    dropped_records: int = 0
    duplicates: int = 0
    """Redelivered transport messages that were recognised and skipped."""
    disconnects: int = 0
    reconnects: int = 0
    gaps: int = 0
    stale: int = 0
    time_regressions: int = 0
    """Episodes of an instrument's ``ts_recv`` going back (``TIME_REGRESSION`` events)."""

    def snapshot(self) -> dict[str, int]:
        """A plain copy of the counters (for logs, metrics and ``--json`` output)."""
        return dataclasses.asdict(self)
