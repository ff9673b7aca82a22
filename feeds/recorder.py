"""The recorder: a durable JetStream consumer writing the daily ``.dbn.zst`` archive.

``tradeagent record`` runs one :class:`Recorder`. It reads the market-data stream with the
durable consumer ``RecorderConfig.durable`` (every subject of ``SourceConfig.dataset``),
reassembles the relay's batches (pieces of several instruments, see
:mod:`feeds.sources.nats_wire`) so records are written in global ``ts_recv`` order, and appends
them through :class:`feeds.dbn.DBNAppender` to one file per day:

    <out_dir>/<dataset token>-<YYYYMMDD>.mbp-10.dbn.zst      e.g. GLBX-MDP3-20261130.mbp-10.dbn.zst

A day starts at ``rotate_hour_utc`` and the file is named by the UTC date on which it starts;
its metadata covers exactly that day and the configured instruments (``feeds.instruments``),
so records of an instrument that is not configured are counted (``unknown_records``), not
written. When the first record of a new day arrives the previous file is flushed and closed:
it is complete.

Durability: every ``flush_interval_s`` the appender writes what was appended as one zstd frame
and fsyncs; only then are the messages acknowledged (``AckPolicy.ALL`` up to the last message
fully written). A recorder killed with SIGKILL therefore leaves every completed file intact, the
open file readable up to its last flush (a torn last frame is cut when it is reopened), and
loses nothing for good: what it had not flushed was not acknowledged and is redelivered.

Restart without duplicates: on start the newest archive file is reopened (the appender scans it
once, cutting a torn tail), which gives the archive's last ``ts_recv`` (the *floor*; read from the
newest earlier file when a kill left the newest one empty,
:attr:`feeds.dbn.DBNAppender.last_ts_recv`) and the records at the floor
(:meth:`feeds.dbn.DBNAppender.records_at_last_ts`). A redelivered batch whose records all lie
below the floor was written before (batches are written in order); a batch ending exactly at the
floor is a duplicate when its records at the floor are already in the file (byte comparison);
a batch reaching past the floor whose records up to the floor stand in the last frame written
(:meth:`feeds.dbn.DBNAppender.last_frame_records`) was cut by a kill at a day boundary: that part
is a duplicate and the rest is new.
Records of a new batch that fall below the floor can only come from a publisher that broke
``ts_recv`` order; they are counted (``out_of_order``) and skipped, never written out of order.
Messages that are not DBN are counted and skipped by the source.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from feeds.config import FeedsConfig
from feeds.dbn import DBNAppender
from feeds.errors import FeedError
from feeds.records import MBP10_DTYPE
from feeds.sources.events import HealthEvent, RecordBatch, SourceEvent
from feeds.sources.factory import config_symbols
from feeds.sources.nats_source import NatsSource
from feeds.sources.subjects import subject_token

__all__ = ["Recorder", "RecorderCounters", "archive_path", "day_start_ns"]

log = logging.getLogger(__name__)

NS_PER_HOUR = 3600 * 1_000_000_000
NS_PER_DAY = 24 * NS_PER_HOUR
ARCHIVE_SUFFIX = ".mbp-10.dbn.zst"


def day_start_ns(ts_ns: int, rotate_hour_utc: int) -> int:
    """Start (ns, UTC) of the archive day holding ``ts_ns``: days begin at ``rotate_hour_utc``."""
    offset = rotate_hour_utc * NS_PER_HOUR
    return (ts_ns - offset) // NS_PER_DAY * NS_PER_DAY + offset


def archive_path(out_dir: Path, dataset: str, day_start: int) -> Path:
    """``<out_dir>/<dataset token>-<YYYYMMDD>.mbp-10.dbn.zst`` for the day starting at ``day_start``."""
    date = dt.datetime.fromtimestamp(day_start // 1_000_000_000, tz=dt.UTC).date()
    return out_dir / f"{subject_token(dataset)}-{date:%Y%m%d}{ARCHIVE_SUFFIX}"


@dataclasses.dataclass(slots=True)
class RecorderCounters:
    """What a recorder run did."""

    records_written: int = 0
    """Records made durable (flushed) by this run."""
    batches: int = 0
    incomplete_batches: int = 0
    """Publisher batches written without all their pieces (a piece was rejected or never came)."""
    duplicate_records: int = 0
    out_of_order: int = 0
    unknown_records: int = 0
    files_completed: int = 0
    flushes: int = 0

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(slots=True)
class _Group:
    """Pieces of one publisher batch received so far."""

    key: tuple[str, int] | None
    parts: int
    pieces: list[np.ndarray]
    last_seq: int | None


def _holds(written: bytes, records: np.ndarray) -> bool:
    """Whether ``records`` stand, whole and record-aligned, in ``written`` (record bytes)."""
    raw = records.tobytes()
    size = MBP10_DTYPE.itemsize
    start = written.find(raw)
    while start >= 0 and start % size:
        start = written.find(raw, start + 1)
    return start >= 0


class Recorder:
    """Write the market-data stream into daily ``.dbn.zst`` files under ``out_dir`` (see the
    module docstring)."""

    def __init__(self, config: FeedsConfig, out_dir: str | Path) -> None:
        self.config = config
        self.out_dir = Path(out_dir)
        self.dataset = config.source.dataset
        self.symbols: Mapping[int, str] = config_symbols(config)
        self.rotate_hour = config.recorder.rotate_hour_utc
        self.counters = RecorderCounters()
        self.source = NatsSource(
            url=config.source.nats_url,
            dataset=self.dataset,
            mode="jetstream",
            stream=config.source.stream,
            durable=config.recorder.durable,
            stream_max_age_s=config.relay.stream_max_age_s,
            fetch_batch=config.recorder.fetch_batch,
            max_batches=config.source.queue_batches,
            stale_after_s=config.health.stale_after_s,
            ack="manual",
        )
        self._known_ids = np.array(sorted(self.symbols), dtype=np.uint32)
        self._writer: DBNAppender | None = None
        self._writer_day: int | None = None
        self._floor = -1
        self._floor_bytes = b""
        self._tail = b""
        """Bytes of the last records written: the last batch (or, after a restart, the archive's
        last frame, which holds whole the last batch part made durable)."""
        self._group = _Group(None, 0, [], None)
        self._written_seq: int | None = None

    # ------------------------------------------------------------------ files

    def _open_day(self, day: int) -> DBNAppender:
        if self._writer_day == day and self._writer is not None:
            return self._writer
        self._close_writer(completed=True)
        writer = self._appender(day).open()
        self._writer, self._writer_day = writer, day
        log.info("recorder: writing %s", writer.path)
        return writer

    def _appender(self, day: int) -> DBNAppender:
        """The (unopened) appender of the archive file of the day starting at ``day``."""
        return DBNAppender(
            archive_path(self.out_dir, self.dataset, day),
            dataset=self.dataset,
            symbols=self.symbols,
            start_ns=day,
            end_ns=day + NS_PER_DAY,
        )

    def _flush_writer(self) -> None:
        writer = self._writer
        if writer is not None and writer.pending_records:
            pending = writer.pending_records
            writer.flush()
            self.counters.records_written += pending

    def _close_writer(self, *, completed: bool) -> None:
        self._flush_writer()
        writer, self._writer, self._writer_day = self._writer, None, None
        if writer is None:
            return
        writer.close()
        if completed:
            self.counters.files_completed += 1
            log.info("recorder: completed %s (%d records)", writer.path, writer.records_flushed)

    def _resume_floor(self) -> None:
        """Reopen the newest archive file (cutting a torn tail) and read the floor: the last
        ``ts_recv`` in the archive. A recorder killed just after it opened a new day leaves that
        file empty; the floor then lies in the newest earlier file that holds records."""
        prefix = f"{subject_token(self.dataset)}-"
        files = sorted(p for p in self.out_dir.glob(f"{prefix}*{ARCHIVE_SUFFIX}") if p.is_file())
        if not files:
            return
        newest = self._open_day(self._file_day(files[-1], prefix))  # resuming scans it once
        source = newest
        for path in reversed(files[:-1]):
            if source.records_flushed:
                break
            source = self._appender(self._file_day(path, prefix))
            source.open().close()  # opening scans it: its floor and last frame
        if source.records_flushed:
            self._floor = source.last_ts_recv
            self._floor_bytes = source.records_at_last_ts().tobytes()
            self._tail = source.last_frame_records().tobytes()
        log.info(
            "recorder: resuming after %s (%d records, floor %d from %s)",
            newest.path,
            newest.records_flushed,
            self._floor,
            source.path.name,
        )

    def _file_day(self, path: Path, prefix: str) -> int:
        stamp = path.name[len(prefix) : -len(ARCHIVE_SUFFIX)]
        try:
            date = dt.datetime.strptime(stamp, "%Y%m%d").replace(tzinfo=dt.UTC)
        except ValueError:
            raise FeedError(f"{path}: unexpected archive file name") from None
        return int(date.timestamp()) * 1_000_000_000 + self.rotate_hour * NS_PER_HOUR

    # ------------------------------------------------------------------ records

    def _take(self, batch: RecordBatch) -> None:
        part = batch.part
        group = self._group
        key = (part.publisher, part.batch) if part is not None else None
        if group.pieces and (key is None or key != group.key):
            self._complete(incomplete=True)
            group = self._group
        group.key = key
        group.parts = part.parts if part is not None else 1
        group.pieces.append(batch.records)
        group.last_seq = batch.transport_seq
        if len(group.pieces) >= group.parts:
            self._complete(incomplete=False)

    def _complete(self, *, incomplete: bool) -> None:
        group = self._group
        self._group = _Group(None, 0, [], None)
        records = group.pieces[0] if len(group.pieces) == 1 else np.concatenate(group.pieces)
        records = records[np.argsort(records["ts_recv"], kind="stable")]
        self.counters.batches += 1
        self.counters.incomplete_batches += incomplete
        if group.last_seq is not None:
            self._written_seq = group.last_seq
        known = np.isin(records["instrument_id"], self._known_ids)
        if not known.all():
            self.counters.unknown_records += int((~known).sum())
            records = records[known]
        if not len(records):
            return
        records = self._drop_written(records)
        if len(records):
            self._write(records)

    def _drop_written(self, records: np.ndarray) -> np.ndarray:
        ts = records["ts_recv"]
        floor = self._floor
        if floor < 0:
            return records
        last = int(ts[-1])
        if last < floor or (last == floor and _holds(self._floor_bytes, records[ts == ts[-1]])):
            self.counters.duplicate_records += len(records)
            return records[:0]
        # A batch reaching past the floor was written in part when a kill cut it at a day
        # boundary (the finished day's file had its share, the new day's file lost the rest):
        # that part is the end of the last frame found on restart.
        written = int(np.searchsorted(ts, np.uint64(floor), side="right"))
        if written and _holds(self._tail, records[:written]):
            self.counters.duplicate_records += written
            return records[written:]
        below = ts < np.uint64(floor)
        if below.any():
            self.counters.out_of_order += int(below.sum())
            log.warning("recorder: %d records arrived below the written floor; skipped", int(below.sum()))
            records = records[~below]
        return records

    def _write(self, records: np.ndarray) -> None:
        ts = records["ts_recv"]
        days = (ts.astype(np.int64) - self.rotate_hour * NS_PER_HOUR) // NS_PER_DAY
        bounds = np.flatnonzero(np.diff(days)) + 1
        for chunk in np.split(records, bounds):
            day = day_start_ns(int(chunk["ts_recv"][0]), self.rotate_hour)
            self._open_day(day).append(chunk)
        last = int(ts[-1])
        at_last = records[ts == ts[-1]].tobytes()
        self._floor_bytes = self._floor_bytes + at_last if last == self._floor else at_last
        self._floor = last
        self._tail = records.tobytes()

    async def _flush(self) -> None:
        """Make appended records durable, then acknowledge the messages they came from."""
        self._flush_writer()
        self.counters.flushes += 1
        if self._written_seq is not None:
            await self.source.ack_through(self._written_seq)

    # ------------------------------------------------------------------ run

    async def run(
        self, stop: asyncio.Event | None = None, progress: Callable[[RecorderCounters], None] | None = None
    ) -> RecorderCounters:
        """Record until ``stop`` is set (or the source fails: :class:`FeedError` propagates after
        everything appended so far was flushed). ``progress`` is called after each flush."""
        stop = stop or asyncio.Event()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._resume_floor()
        interval = self.config.recorder.flush_interval_s
        await self.source.start()
        stopper = asyncio.create_task(stop.wait())
        getter: asyncio.Task[SourceEvent | None] | None = None
        try:
            next_flush = time.monotonic() + interval
            while not stop.is_set():
                if getter is None:
                    getter = asyncio.create_task(self.source.next())
                timeout = max(0.0, next_flush - time.monotonic())
                done, _ = await asyncio.wait(
                    {getter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    event, getter = getter.result(), None
                    if event is None:
                        break
                    if isinstance(event, RecordBatch):
                        self._take(event)
                    elif isinstance(event, HealthEvent):
                        log.warning("recorder: %s %s", event.kind, event.detail)
                if time.monotonic() >= next_flush:
                    await self._flush()
                    next_flush = time.monotonic() + interval
                    if progress is not None:
                        progress(self.counters)
        finally:
            stopper.cancel()
            if getter is not None:
                getter.cancel()
            try:
                await self._flush()
            finally:
                self._close_writer(completed=False)
                await self.source.stop()
        log.info(
            "recorder: stopped (%s; source %s)", self.counters.snapshot(), self.source.counters.snapshot()
        )
        return self.counters
