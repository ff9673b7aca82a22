"""Incremental DBN decoding of live bytes (NATS messages, a socket), and the reverse for publishing.

:class:`StreamDecoder` is fed byte chunks and returns the MBP-10 records each chunk completes,
as :data:`~feeds.records.MBP10_DTYPE` arrays. It never raises on bad bytes:

* every record header (length byte, ``rtype``) is checked against Databento's record sizes for
  the stream's DBN version before any byte is viewed as a record (``databento_dbn.DBNDecoder``
  panics on a length that does not match the ``rtype``, so it is never handed unchecked bytes);
* a chunk with an unknown ``rtype``, an impossible length, a bad metadata header or (in
  ``"message"`` framing) a partial record is *rejected*: counted, its bytes and any partial record
  carried from earlier chunks dropped, and nothing from it reaches the output. The decoder then
  resynchronises on the next chunk, which it takes to start on a record boundary (always true for
  NATS messages; a socket source should reconnect when :attr:`StreamCounters.rejected_chunks`
  grows);
* other record types (system heartbeats, symbol mappings, errors...) are counted by ``rtype`` and
  skipped.

DBN carries no checksum: a flipped bit inside a price or size field of a well-framed MBP-10
record cannot be seen here. Such values are the book health checks' business (DESIGN section 4).

The metadata of a stream that starts with one (``has_metadata=True``) is decoded by
``databento_dbn.DBNDecoder``; it sets the DBN version and ``ts_out`` of the records that follow.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import databento_dbn
import numpy as np
import numpy.typing as npt

from feeds.dbn.framing import (
    HEADER_SIZE,
    LENGTH_MULTIPLIER,
    MBP10_LENGTH,
    MBP10_SIZE,
    RECORD_SIZES,
    check_mbp10,
    is_rust_panic,
)
from feeds.records import MBP10_DTYPE, MBP10_RTYPE

__all__ = ["StreamCounters", "StreamDecoder", "record_bytes", "record_messages"]

_PRELUDE = struct.Struct("<3sBI")
"""DBN metadata prelude: magic ``b"DBN"``, version byte, u32 length of the rest."""
MAX_METADATA_BYTES = 1 << 24
TS_OUT_SIZE = 8
_FIRST_RUN = 64
_EMPTY: npt.NDArray[np.void] = np.empty(0, dtype=MBP10_DTYPE)
_EMPTY.flags.writeable = False


@dataclass(slots=True)
class StreamCounters:
    """What a :class:`StreamDecoder` has seen since it was created."""

    chunks: int = 0
    bytes: int = 0
    records: int = 0
    """MBP-10 records returned."""
    rejected_chunks: int = 0
    rejected_bytes: int = 0
    other_records: Counter[int] = field(default_factory=Counter)
    """Well-framed records of other types, by ``rtype``."""


class StreamDecoder:
    """Decode MBP-10 records from byte chunks.

    ``framing="stream"``: chunks are arbitrary slices of a byte stream (records may straddle
    chunks; a socket). ``framing="message"``: every chunk holds whole records (a NATS message);
    a partial record is a rejection. ``has_metadata``: the stream starts with DBN metadata (a
    socket stream or a file's bytes); otherwise it carries bare records of DBN ``input_version``
    with or without ``ts_out`` (the 8-byte send timestamp is stripped from the output).
    """

    def __init__(
        self,
        *,
        has_metadata: bool = False,
        input_version: int = 3,
        ts_out: bool = False,
        framing: Literal["stream", "message"] = "stream",
    ) -> None:
        if input_version not in RECORD_SIZES:
            raise ValueError(f"input_version must be one of {sorted(RECORD_SIZES)}")
        if framing == "message" and has_metadata:
            raise ValueError("message framing carries bare records; has_metadata must be False")
        self.framing = framing
        self.counters = StreamCounters()
        self.metadata: databento_dbn.Metadata | None = None
        self.last_error: str | None = None
        """Why the last chunk was rejected (None until one is)."""
        self.version = input_version
        """DBN version of the records (set by the metadata when the stream has one)."""
        self._want_metadata = has_metadata
        self._carry = b""
        self._configure(input_version, ts_out)

    def _configure(self, version: int, ts_out: bool) -> None:
        self.version = version
        self._extra = TS_OUT_SIZE if ts_out else 0
        self._sizes = {rtype: size + self._extra for rtype, size in RECORD_SIZES[version].items()}
        self._mbp_size = MBP10_SIZE + self._extra
        self._mbp_length = self._mbp_size // LENGTH_MULTIPLIER

    @property
    def buffered(self) -> int:
        """Bytes held back waiting for the rest of a record (or of the metadata)."""
        return len(self._carry)

    def feed(self, chunk: bytes) -> npt.NDArray[np.void]:
        """Add ``chunk``; return the MBP-10 records it completes (shape ``[n]``, possibly empty).

        Never raises on bad bytes: a bad chunk is counted in ``counters.rejected_chunks`` and
        yields an empty array.
        """
        data = bytes(chunk)
        self.counters.chunks += 1
        self.counters.bytes += len(data)
        if not self._carry and not self._want_metadata and not self._extra and self._all_mbp10(data):
            # Copy as bytes, then view: copying a structured dtype goes field by field (slow).
            fast: npt.NDArray[np.void] = np.frombuffer(data, dtype=np.uint8).copy().view(MBP10_DTYPE)
            self.counters.records += len(fast)
            return fast
        buf = self._carry + data if self._carry else data
        if self._want_metadata:
            rest = self._take_metadata(buf, len(data))
            if rest is None:
                return _EMPTY
            buf = rest
        error, end, segments, others = self._frame(buf)
        if error is None and self.framing == "message" and end != len(buf):
            error = f"message ends inside a record ({len(buf) - end} stray bytes)"
        if error is not None:
            self._reject(len(data), error)
            return _EMPTY
        self._carry = buf[end:]
        self.counters.other_records.update(others)
        if not segments:
            return _EMPTY
        # Rows of bytes, ts_out (if any) cut off, then viewed as Databento's MBP-10 dtype.
        u8 = np.frombuffer(buf, dtype=np.uint8)
        rows = [u8[b:e].reshape(-1, self._mbp_size)[:, :MBP10_SIZE] for b, e in segments]
        packed = np.ascontiguousarray(rows[0]) if len(rows) == 1 else np.concatenate(rows)
        records: npt.NDArray[np.void] = packed.view(MBP10_DTYPE).reshape(-1)
        if self._extra:
            records["length"] = MBP10_LENGTH  # the header now describes the record without ts_out
        self.counters.records += len(records)
        return records

    @staticmethod
    def _all_mbp10(data: bytes) -> bool:
        """Fast path: ``data`` is whole MBP-10 records only (the usual NATS message or batch)."""
        n = len(data)
        if n == 0 or n % MBP10_SIZE:
            return False
        if n == MBP10_SIZE:
            return data[0] == MBP10_LENGTH and data[1] == MBP10_RTYPE
        u8 = np.frombuffer(data, dtype=np.uint8)
        return bool(np.all(u8[0::MBP10_SIZE] == MBP10_LENGTH)) and bool(
            np.all(u8[1::MBP10_SIZE] == MBP10_RTYPE)
        )

    def reset(self) -> None:
        """Drop any partial record held back (e.g. after a NATS reconnect). A socket source that
        reconnects gets a new stream with new metadata: it makes a new decoder instead."""
        self._carry = b""

    def _reject(self, nbytes: int, reason: str) -> None:
        self.counters.rejected_chunks += 1
        self.counters.rejected_bytes += nbytes
        self.last_error = reason
        self._carry = b""

    def _take_metadata(self, buf: bytes, nbytes: int) -> bytes | None:
        """Consume the metadata at the start of ``buf``; return the bytes after it, or None
        (metadata incomplete, held back; or bad, chunk rejected)."""
        if len(buf) < _PRELUDE.size:
            if buf[:3] != b"DBN"[: len(buf)]:
                self._reject(nbytes, "stream does not start with DBN metadata")
            else:
                self._carry = buf
            return None
        magic, version, length = _PRELUDE.unpack_from(buf)
        if magic != b"DBN" or version not in RECORD_SIZES or length > MAX_METADATA_BYTES:
            self._reject(nbytes, f"bad DBN metadata prelude {buf[: _PRELUDE.size]!r}")
            return None
        total = _PRELUDE.size + length
        if len(buf) < total:
            self._carry = buf
            return None
        try:
            decoded = databento_dbn.DBNDecoder(has_metadata=True).write_and_decode(buf[:total])
        except BaseException as exc:
            if not isinstance(exc, databento_dbn.DBNError | ValueError) and not is_rust_panic(exc):
                raise
            decoded = []
        metadata = decoded[0] if decoded else None
        if not isinstance(metadata, databento_dbn.Metadata):
            self._reject(nbytes, "undecodable DBN metadata")
            return None
        self.metadata = metadata
        self._want_metadata = False
        # The decoder upgrades the metadata it returns to v3; the records keep the prelude's version.
        self._configure(version, bool(metadata.ts_out))
        return buf[total:]

    def _frame(self, buf: bytes) -> tuple[str | None, int, list[tuple[int, int]], Counter[int]]:
        """Walk record headers. Returns (error, end of the last whole record, byte ranges of
        MBP-10 runs, other records by rtype). Long MBP-10 runs are checked vectorised."""
        u8 = np.frombuffer(buf, dtype=np.uint8)
        n = len(buf)
        size, length_byte = self._mbp_size, self._mbp_length
        segments: list[tuple[int, int]] = []
        others: Counter[int] = Counter()
        off = 0
        run = _FIRST_RUN
        while n - off >= 2:
            length = buf[off] * LENGTH_MULTIPLIER
            rtype = buf[off + 1]
            if rtype == MBP10_RTYPE and length == size:
                whole = min((n - off) // size, run)
                if whole == 0:
                    break
                heads = u8[off : off + whole * size : size]
                kinds = u8[off + 1 : off + whole * size : size]
                ok = (heads == length_byte) & (kinds == MBP10_RTYPE)
                good = whole if bool(ok.all()) else int(np.argmin(ok))
                segments.append((off, off + good * size))
                off += good * size
                run = run * 2 if good == whole else _FIRST_RUN
                continue
            expected = self._sizes.get(rtype)
            if expected is None:
                return f"unknown rtype {rtype:#04x} at byte {off}", off, segments, others
            if length != expected or length < HEADER_SIZE:
                return (
                    f"rtype {rtype:#04x} with length {length} bytes at byte {off} (expected {expected})",
                    off,
                    segments,
                    others,
                )
            if n - off < length:
                break
            others[rtype] += 1
            off += length
            run = _FIRST_RUN
        return None, off, segments, others


def record_bytes(records: npt.NDArray[np.void]) -> bytes:
    """Bare DBN v3 record bytes of ``records`` (:data:`MBP10_DTYPE`), one batch: what a NATS
    message carries and :class:`StreamDecoder` reads back."""
    check_mbp10(records, "record_bytes")
    return np.ascontiguousarray(records).tobytes()


def record_messages(records: npt.NDArray[np.void]) -> list[bytes]:
    """One bare record (368 bytes) per element of ``records``, for one-record-per-message
    publishing."""
    raw = record_bytes(records)
    return [raw[begin : begin + MBP10_SIZE] for begin in range(0, len(raw), MBP10_SIZE)]
