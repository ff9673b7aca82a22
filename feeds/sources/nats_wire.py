"""What a market-data NATS message carries (the parsing layer of the NATS feed).

Payload: bare DBN version 3 MBP-10 record bytes (no metadata), one or more whole records of one
instrument, in ``ts_recv`` order; one message carries up to ``feeds.relay.batch_records``
records (368 bytes each), which is what makes the bus fast (per-message costs dominate).
Consumers decode payloads with :class:`feeds.dbn.StreamDecoder` in ``"message"`` framing: a
payload that is not whole MBP-10 records is counted and rejected.

Headers set by ``tradeagent relay`` (optional for other publishers; a consumer copes without):

``Md-Relay``
    Random id of one relay run.
``Md-Seq``
    Per subject, the message counter of that run (1, 2, ...): a consumer that sees it jump
    reports the missing messages as a gap (core NATS is at-most-once).
``Md-Batch``
    ``<batch>/<parts>``: the message is one of ``parts`` pieces (published back to back, across
    subjects) of the relay's ``batch``-th source batch. The recorder reassembles the pieces to
    write records of several instruments in global ``ts_recv`` order.
``Nats-Msg-Id``
    ``<relay>.<subject>.<seq>``: JetStream drops a republished duplicate (the relay retries a
    publish whose acknowledgement timed out).

A message JetStream delivers carries its stream sequence in its reply (acknowledgement) subject
(:func:`stream_sequence`).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping

import numpy as np

from feeds.dbn import record_bytes
from feeds.dbn.framing import MBP10_SIZE, mbp10_header_ok
from feeds.records import MBP10_DTYPE
from feeds.sources.events import BatchPart
from feeds.sources.subjects import subject_for

__all__ = [
    "HEADER_BATCH",
    "HEADER_RELAY",
    "HEADER_SEQ",
    "MessageEncoder",
    "SequenceTracker",
    "WireMessage",
    "WireTags",
    "parse_tags",
    "stream_sequence",
    "whole_records",
]

HEADER_RELAY = "Md-Relay"
HEADER_SEQ = "Md-Seq"
HEADER_BATCH = "Md-Batch"
HEADER_MSG_ID = "Nats-Msg-Id"


@dataclasses.dataclass(frozen=True, slots=True)
class WireMessage:
    """One message to publish: subject, payload (bare record bytes), headers, record count."""

    subject: str
    payload: bytes
    headers: dict[str, str]
    records: int


@dataclasses.dataclass(frozen=True, slots=True)
class WireTags:
    """The relay headers of a received message (``None`` where absent or malformed)."""

    relay: str | None
    seq: int | None
    part: BatchPart | None


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_tags(headers: Mapping[str, str] | None) -> WireTags:
    """Read the relay headers; never raises (a malformed header reads as absent)."""
    if not headers:
        return WireTags(None, None, None)
    relay = headers.get(HEADER_RELAY)
    part = None
    batch, _, parts = (headers.get(HEADER_BATCH) or "").partition("/")
    number, count = _int_or_none(batch), _int_or_none(parts)
    if relay is not None and number is not None and count is not None and count >= 1:
        part = BatchPart(relay, number, count)
    return WireTags(relay, _int_or_none(headers.get(HEADER_SEQ)), part)


_ACK_TOKENS_V1 = 9
"""``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>``"""
_ACK_TOKENS_V2 = 11
"""``$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<stream seq>...`` (11 or 12)"""


def stream_sequence(reply: str | None) -> int | None:
    """The JetStream stream sequence of a message delivered with acknowledgement subject
    ``reply`` (either form of ``$JS.ACK...``); ``None`` for anything else. What
    ``Msg.metadata.sequence.stream`` gives, without building the rest of the metadata."""
    if not reply or not reply.startswith("$JS.ACK."):
        return None
    tokens = reply.split(".")
    if len(tokens) == _ACK_TOKENS_V1:
        token = tokens[5]
    elif len(tokens) >= _ACK_TOKENS_V2:
        token = tokens[7]
    else:
        return None
    return int(token) if token.isdecimal() else None


def whole_records(payloads: list[bytes]) -> list[np.ndarray | None]:
    """Per payload, its records when it is whole MBP-10 records (the usual message), else
    ``None`` (for :class:`feeds.dbn.StreamDecoder` to decode or reject). The payloads of
    messages received together are checked as one buffer: one header check for all of them
    instead of a decoder call each. The records are read-only views of that buffer."""
    whole = [p for p in payloads if p and len(p) % MBP10_SIZE == 0]
    out: list[np.ndarray | None] = [None] * len(payloads)
    if not whole:
        return out
    records = np.frombuffer(whole[0] if len(whole) == 1 else b"".join(whole), dtype=MBP10_DTYPE)
    bad = np.flatnonzero(~mbp10_header_ok(records))
    start = 0
    for k, payload in enumerate(payloads):
        if not payload or len(payload) % MBP10_SIZE:
            continue
        end = start + len(payload) // MBP10_SIZE
        if not bad.size or not ((bad >= start) & (bad < end)).any():
            out[k] = records[start:end]
        start = end
    return out


class MessageEncoder:
    """Turn record batches into :class:`WireMessage` values (relay side).

    Records are grouped by instrument (one subject per symbol), keeping their order within each
    instrument, and cut into messages of at most ``batch_records`` records. Records of an
    instrument missing from ``symbols`` are returned separately (the caller counts them).
    """

    def __init__(self, dataset: str, batch_records: int) -> None:
        if batch_records < 1:
            raise ValueError("batch_records must be >= 1")
        self.dataset = dataset
        self.batch_records = batch_records
        self.relay_id = secrets.token_hex(6)
        self._seq: dict[str, int] = {}
        self._batches = 0
        self._subjects: dict[int, str] = {}

    def encode(self, records: np.ndarray, symbols: Mapping[int, str]) -> tuple[list[WireMessage], np.ndarray]:
        """Messages for ``records`` (:data:`MBP10_DTYPE`, ``ts_recv`` order) and the records whose
        instrument has no symbol (not encoded)."""
        if not len(records):
            return [], records[:0]
        ids = records["instrument_id"]
        unique = np.unique(ids)
        pieces: list[tuple[str, np.ndarray]] = []
        unknown: list[np.ndarray] = []
        for instrument_id in unique.tolist():
            same = records if len(unique) == 1 else records[ids == instrument_id]
            subject = self._subject(instrument_id, symbols)
            if subject is None:
                unknown.append(same)
                continue
            pieces.extend(
                (subject, same[begin : begin + self.batch_records])
                for begin in range(0, len(same), self.batch_records)
            )
        rejected = np.concatenate(unknown) if unknown else records[:0]
        if not pieces:
            return [], rejected
        self._batches += 1
        batch = f"{self._batches}/{len(pieces)}"
        out: list[WireMessage] = []
        for subject, chunk in pieces:
            seq = self._seq.get(subject, 0) + 1
            self._seq[subject] = seq
            headers = {
                HEADER_RELAY: self.relay_id,
                HEADER_SEQ: str(seq),
                HEADER_BATCH: batch,
                HEADER_MSG_ID: f"{self.relay_id}.{subject}.{seq}",
            }
            out.append(WireMessage(subject, record_bytes(chunk), headers, len(chunk)))
        return out, rejected

    def _subject(self, instrument_id: int, symbols: Mapping[int, str]) -> str | None:
        subject = self._subjects.get(instrument_id)
        if subject is None:
            symbol = symbols.get(instrument_id)
            if symbol is None:
                return None
            subject = self._subjects[instrument_id] = subject_for(self.dataset, symbol)
        return subject


class SequenceTracker:
    """Consumer side: per subject, the last ``Md-Seq`` of the current relay run.

    :meth:`observe` returns how many messages were skipped before this one (0 when in order, a
    new relay run, or untagged) and whether it is a repeat of one already seen.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, int]] = {}

    def observe(self, subject: str, tags: WireTags) -> tuple[int, bool]:
        if tags.relay is None or tags.seq is None:
            return 0, False
        last = self._last.get(subject)
        if last is None or last[0] != tags.relay:
            self._last[subject] = (tags.relay, tags.seq)
            return 0, False
        if tags.seq <= last[1]:
            return 0, True
        self._last[subject] = (tags.relay, tags.seq)
        return tags.seq - last[1] - 1, False
