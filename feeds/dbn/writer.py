"""Writing MBP-10 DBN files (DBN version 3, plain or zstd by the ``.zst`` suffix).

The metadata is encoded by ``databento_dbn.Metadata`` (dataset, schema mbp-10, symbology
``raw_symbol -> instrument_id`` with one mapping interval per symbol covering the file's days);
the records follow as the bytes of a :data:`~feeds.records.MBP10_DTYPE` array, exactly what
Databento's encoder writes for the same records and ~35x faster than encoding record objects.

:class:`DBNAppender` is the recorder's writer. A ``.dbn.zst`` file is a sequence of zstd frames:
the metadata is the first frame and every :meth:`DBNAppender.flush` writes the records appended
since the previous flush as one complete frame, then fsyncs. ``databento.DBNStore`` reads such
multi-frame files (checked), so a process killed after ``flush()`` leaves a file readable up to
that flush; only records appended after the last flush are lost. Reopening an existing file
resumes it: the metadata must be byte-identical, and a torn last frame (a kill in the middle of
a write) is cut off first.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import databento_dbn
import numpy as np
import numpy.typing as npt
import zstandard
from databento_dbn.metadata import MappingInterval

from feeds.dbn.framing import MBP10_SIZE, check_mbp10, mbp10_header_ok
from feeds.errors import DBNFormatError, UnknownInstrument
from feeds.records import MBP10_DTYPE

__all__ = ["DBNAppender", "build_metadata", "write_mbp10"]

DBN_VERSION = 3
ZSTD_LEVEL = 3
WRITE_BLOCK_RECORDS = 1 << 18
"""write_mbp10 writes (and compresses) this many records per zstd frame."""
_SCAN_SLICE = 1 << 20


@dataclass(slots=True)
class _Interval:
    """Satisfies ``databento_dbn.metadata.MappingInterval``."""

    start_date: dt.date
    end_date: dt.date
    symbol: str


@dataclass(slots=True)
class _SymbolMapping:
    """Satisfies ``databento_dbn.metadata.SymbolMapping``."""

    raw_symbol: str
    intervals: Sequence[MappingInterval]


def _date(ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=dt.UTC).date()


def build_metadata(
    *, dataset: str, symbols: Mapping[int, str], start_ns: int, end_ns: int | None
) -> databento_dbn.Metadata:
    """DBN v3 metadata for an MBP-10 file of ``symbols`` (instrument_id -> raw symbol) over
    ``[start_ns, end_ns)`` (ns since the UNIX epoch; ``end_ns`` None leaves the end undefined,
    as an open recording does). Raises :class:`DBNFormatError` on unusable arguments."""
    if not dataset:
        raise DBNFormatError("dataset must not be empty")
    if not symbols:
        raise DBNFormatError("symbols must map at least one instrument id to a symbol")
    if start_ns < 0 or (end_ns is not None and end_ns < start_ns):
        raise DBNFormatError(f"bad time range [{start_ns}, {end_ns})")
    for instrument_id, symbol in symbols.items():
        if not 0 <= instrument_id < 2**32:
            raise DBNFormatError(f"instrument id {instrument_id} is outside 0..2**32-1")
        if not symbol or len(symbol) > 70:
            raise DBNFormatError(
                f"symbol {symbol!r} of instrument {instrument_id} must have 1..70 characters"
            )
    first = _date(start_ns)
    last = _date(end_ns - 1) if end_ns is not None and end_ns > start_ns else first
    intervals: dict[str, list[_Interval]] = {}
    for instrument_id, symbol in sorted(symbols.items()):
        intervals.setdefault(symbol, []).append(
            _Interval(first, last + dt.timedelta(days=1), str(instrument_id))
        )
    return databento_dbn.Metadata(
        dataset=dataset,
        start=start_ns,
        stype_in=databento_dbn.SType.from_str("raw_symbol"),
        stype_out=databento_dbn.SType.from_str("instrument_id"),
        schema=databento_dbn.Schema.from_str("mbp-10"),
        symbols=sorted(intervals),
        mappings=[_SymbolMapping(symbol, tuple(iv)) for symbol, iv in sorted(intervals.items())],
        end=end_ns,
        ts_out=False,
        version=DBN_VERSION,
    )


def _is_zstd(path: Path) -> bool:
    return path.name.endswith(".zst")


class DBNAppender:
    """Append MBP-10 records to a DBN file, durably at each :meth:`flush`.

    Use as a context manager or call :meth:`open`/:meth:`close`. Records must arrive in
    ``ts_recv`` order (also across appends) and belong to an instrument of ``symbols``; else
    :class:`DBNFormatError` / :class:`UnknownInstrument`, and nothing of the offending batch is
    kept. Not thread-safe: one writer per file.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        dataset: str,
        symbols: Mapping[int, str],
        start_ns: int,
        end_ns: int | None = None,
        zstd_level: int = ZSTD_LEVEL,
    ) -> None:
        self.path = Path(path)
        self._metadata = bytes(
            build_metadata(dataset=dataset, symbols=symbols, start_ns=start_ns, end_ns=end_ns)
        )
        self._ids = np.array(sorted(symbols), dtype=np.uint32)
        self._zstd = _is_zstd(self.path)
        self._compressor = zstandard.ZstdCompressor(level=zstd_level)
        self._fd: int | None = None
        self._pending: list[bytes] = []
        self._pending_records = 0
        self._last_ts = 0
        self._at_last_ts = b""  # bytes of the records whose ts_recv is _last_ts
        self._last_frame = b""  # record bytes of the newest frame flushed or found
        self.records_flushed = 0
        """Records durably in the file (including those found when resuming)."""

    @property
    def pending_records(self) -> int:
        """Records appended since the last flush (lost if the process dies now)."""
        return self._pending_records

    @property
    def last_ts_recv(self) -> int:
        """``ts_recv`` (UNIX ns) of the last record appended, or found in the file when resuming;
        0 when there is none. Appends must not go below it."""
        return self._last_ts

    def records_at_last_ts(self) -> npt.NDArray[np.void]:
        """The records (appended, or found when resuming) whose ``ts_recv`` is
        :attr:`last_ts_recv`, in file order: what a writer resuming after a restart compares a
        redelivered batch with. A new array of :data:`MBP10_DTYPE`, empty when there is none."""
        return np.frombuffer(self._at_last_ts, dtype=MBP10_DTYPE).copy()

    def last_frame_records(self) -> npt.NDArray[np.void]:
        """The records of the newest write that reached the file: the last :meth:`flush`, or,
        when resuming, the file's last complete zstd frame (a plain file: its last slice of at
        most 1 MiB). Everything appended between two flushes is one frame, so a writer resuming
        after a kill finds here whole the last run it had made durable. A new array of
        :data:`MBP10_DTYPE`, empty when there is none."""
        return np.frombuffer(self._last_frame, dtype=MBP10_DTYPE).copy()

    def _note_last(self, records: npt.NDArray[np.void]) -> None:
        """Track :attr:`last_ts_recv` and the records at it after ``records`` (non-empty,
        ``ts_recv`` order) joined the file."""
        ts = records["ts_recv"]
        last = int(ts[-1])
        at_last = np.ascontiguousarray(records[ts == ts[-1]]).tobytes()
        self._at_last_ts = self._at_last_ts + at_last if last == self._last_ts else at_last
        self._last_ts = last

    def __enter__(self) -> DBNAppender:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open(self) -> DBNAppender:
        """Create the file (metadata first, durably) or resume an existing one."""
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size == 0:
                self._write(fd, self._compressor.compress(self._metadata) if self._zstd else self._metadata)
            else:
                self._resume(fd)
        except BaseException:
            os.close(fd)
            raise
        os.lseek(fd, 0, os.SEEK_END)
        self._fd = fd
        return self

    def append(self, records: npt.NDArray[np.void]) -> None:
        """Queue ``records`` (:data:`MBP10_DTYPE`, shape ``[n]``) for the next flush."""
        if self._fd is None:
            raise DBNFormatError(f"{self.path}: append() on a writer that is not open")
        check_mbp10(records, f"append to {self.path}")
        if not len(records):
            return
        ts = records["ts_recv"]
        if int(ts[0]) < self._last_ts or (len(ts) > 1 and not bool(np.all(ts[1:] >= ts[:-1]))):
            raise DBNFormatError(f"append to {self.path}: records are not in ts_recv order")
        ids = records["instrument_id"]
        known = np.isin(ids, self._ids)
        if not known.all():
            raise UnknownInstrument(
                f"append to {self.path}: instrument id {int(ids[np.argmin(known)])} "
                "is not in the file's symbology"
            )
        self._pending.append(np.ascontiguousarray(records).tobytes())
        self._pending_records += len(records)
        self._note_last(records)

    def flush(self) -> None:
        """Write the pending records as one complete zstd frame (or plain bytes) and fsync."""
        if self._fd is None or not self._pending:
            return
        payload = b"".join(self._pending)
        self._write(self._fd, self._compressor.compress(payload) if self._zstd else payload)
        self._last_frame = payload
        self.records_flushed += self._pending_records
        self._pending.clear()
        self._pending_records = 0

    def close(self) -> None:
        """Flush and close; idempotent."""
        if self._fd is None:
            return
        try:
            self.flush()
        finally:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)

    def _resume(self, fd: int) -> None:
        """Check the existing file's metadata, cut a torn tail, restore the counters and
        :attr:`last_ts_recv`. Reads the file in bounded slices, one zstd frame at a time (memory
        bounded by one frame)."""
        size = os.fstat(fd).st_size
        good_end = self._scan(fd, size)
        if good_end < size:
            os.ftruncate(fd, good_end)
            os.fsync(fd)

    def _take_existing(self, payload: bytes) -> None:
        """Count a run of record bytes found in the file; raise unless all are MBP-10."""
        records = np.frombuffer(payload, dtype=MBP10_DTYPE)
        if not mbp10_header_ok(records).all():
            raise DBNFormatError(f"{self.path}: existing file holds records that are not MBP-10")
        if len(records):
            self.records_flushed += len(records)
            self._note_last(records)
            self._last_frame = payload

    def _scan(self, fd: int, size: int) -> int:
        """Take in the records of an existing file; return the end of its last complete frame
        (zstd) or record (plain)."""
        meta_len = len(self._metadata)
        offset = 0
        if not self._zstd:
            if os.pread(fd, meta_len, 0) != self._metadata:
                raise DBNFormatError(f"{self.path}: exists with different metadata; cannot resume it")
            end = meta_len + (size - meta_len) // MBP10_SIZE * MBP10_SIZE
            step = _SCAN_SLICE // MBP10_SIZE * MBP10_SIZE
            for begin in range(meta_len, end, step):
                self._take_existing(os.pread(fd, min(step, end - begin), begin))
            return end
        while offset < size:
            frame = _read_frame(fd, offset, size)
            if frame is None:
                break  # torn frame: written partly when the process died
            payload, frame_end = frame
            if offset == 0:
                if payload != self._metadata:
                    raise DBNFormatError(f"{self.path}: exists with different metadata; cannot resume it")
            elif len(payload) % MBP10_SIZE:
                break
            else:
                self._take_existing(payload)
            offset = frame_end
        if offset == 0:
            raise DBNFormatError(f"{self.path}: exists, but its metadata frame is unreadable; cannot resume")
        return offset


def _read_frame(fd: int, offset: int, size: int) -> tuple[bytes, int] | None:
    """Decompress the zstd frame starting at ``offset`` of ``fd``: (content, offset after the
    frame), or None when the frame is corrupt or incomplete. Input is read in bounded slices."""
    frame = zstandard.ZstdDecompressor().decompressobj()
    parts: list[bytes] = []
    pos = offset
    try:
        while not frame.eof and pos < size:
            piece = os.pread(fd, _SCAN_SLICE, pos)
            parts.append(frame.decompress(piece))
            pos += len(piece) - len(frame.unused_data) if frame.eof else len(piece)
    except zstandard.ZstdError:
        return None
    return (b"".join(parts), pos) if frame.eof else None


def write_mbp10(
    path: str | Path,
    records: npt.NDArray[np.void],
    *,
    dataset: str,
    symbols: Mapping[int, str],
    start_ns: int,
    end_ns: int | None,
) -> Path:
    """Write ``records`` (:data:`MBP10_DTYPE`, ``ts_recv`` order) as one DBN v3 file, zstd if the
    name ends in ``.zst``. Written to a temporary name and renamed, so ``path`` is either absent
    or complete. The output is a pure function of the arguments (byte-identical on rerun)."""
    target = Path(path)
    check_mbp10(records, f"write {target}")
    tmp = target.with_name(f".tmp.{target.name}")  # keeps the suffix; readers skip dot-files
    tmp.unlink(missing_ok=True)
    try:
        with DBNAppender(tmp, dataset=dataset, symbols=symbols, start_ns=start_ns, end_ns=end_ns) as out:
            for begin in range(0, len(records), WRITE_BLOCK_RECORDS):
                out.append(records[begin : begin + WRITE_BLOCK_RECORDS])
                out.flush()
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
