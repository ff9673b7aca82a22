"""Replay of recorded DBN files as a source: as fast as possible, or paced at real time x N.

The path is one ``.dbn``/``.dbn.zst`` file or a directory of daily files (read in time order
by :func:`feeds.dbn.iter_mbp10`). With ``pace == 0`` every chunk is yielded as soon as the
consumer asks for it. With ``pace == N > 0`` a record is released when the wall clock has
advanced ``(ts_recv - first ts_recv) / N`` since the replay started; records due together form
one batch, and recorded gaps (overnight, outages) are replayed as they are, i.e. slept through
(scaled by N) without any event: a replayed gap looks exactly like the original one to the
book's stale-feed check.

After :meth:`~feeds.sources.base.Source.resume_after` (a restarted relay), the records the stream
already holds are dropped as each chunk is read, before the pacing: the first record released
starts the replay clock, so a restarted relay publishes at once instead of replaying the time
its previous run took.

With ``dataset`` given (what a daemon replays: ``feeds.source.dataset``), a file whose metadata
names another dataset is read but its records are counted (``rejected_dataset_records``),
reported once per dataset (``MISMATCH``) and never yielded; with ``instruments`` given, so are
records of other instruments (:meth:`~feeds.sources.base.Source._screen`).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from feeds.dbn import DBNInfo, dbn_files, read_metadata
from feeds.dbn.reader import iter_mbp10_files
from feeds.errors import FeedError
from feeds.sources.base import Source
from feeds.sources.events import RecordBatch, SourceEvent

__all__ = ["ReplaySource"]


class ReplaySource(Source):
    """Records of a DBN file or directory, in ``ts_recv`` order.

    ``batch_records`` caps the size of one :class:`RecordBatch` (and so the latency between
    batches when paced). Files are opened at :meth:`start` (so a bad path fails there, as
    :class:`~feeds.errors.DBNFormatError`) and read lazily in bounded memory.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        pace: float = 0.0,
        batch_records: int = 4096,
        dataset: str | None = None,
        instruments: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(f"replay:{Path(path).name}", instruments=instruments)
        if pace < 0 or not np.isfinite(pace):
            raise FeedError(f"replay pace must be 0 (as fast as possible) or > 0, got {pace}")
        if batch_records < 1:
            raise FeedError(f"replay batch_records must be >= 1, got {batch_records}")
        self.path = Path(path)
        self.pace = pace
        self.batch_records = batch_records
        self.dataset = dataset
        self._expected = dataset
        self._chunks: Iterator[tuple[DBNInfo, np.ndarray]] | None = None
        self._chunk: np.ndarray | None = None
        self._pos = 0
        self._pending: collections.deque[SourceEvent] = collections.deque()
        self._t0_wall_ns = 0
        self._t0_ts_ns: int | None = None

    async def _start(self) -> None:
        for file in dbn_files(self.path):
            info = read_metadata(file)
            self.dataset = self.dataset or info.dataset
            self.symbols.update(info.symbols)
        self._chunks = iter_mbp10_files(self.path, chunk_records=max(self.batch_records, 65_536))

    async def _stop(self) -> None:
        self._chunks = None
        self._chunk = None

    def _current(self) -> np.ndarray | None:
        """The chunk being replayed, reading the next one when it is used up (None at the end);
        chunks of a file of another dataset are counted and passed over."""
        while self._chunk is None or self._pos >= len(self._chunk):
            if self._chunks is None:
                return None
            try:
                info, self._chunk = next(self._chunks)
            except StopIteration:
                self._chunks = None
                return None
            self._pos = 0
            if self._expected is not None and info.dataset != self._expected:
                self._count_read(self._chunk)
                detail = (
                    f"{info.path} holds dataset {info.dataset}, not the configured {self._expected}: "
                    f"its records are counted and never traded; replay {self._expected} files, or "
                    f'set feeds.source.dataset = "{info.dataset}"'
                )
                event = self._refuse("dataset", info.dataset, len(self._chunk), detail)
                if event is not None:
                    self._pending.append(event)
                self._pos = len(self._chunk)
            elif self._resume is not None:
                # Records a stream already holds go before the pacing ever sees them.
                kept = self._skip_resumed(self._chunk)
                skipped = len(self._chunk) - len(kept)
                self.counters.messages += skipped  # read from the files, as every record is
                self.counters.bytes += skipped * self._chunk.itemsize
                self._chunk = kept
        return self._chunk

    async def _next(self) -> SourceEvent | None:
        while not self._pending:
            chunk = self._current()
            if self._pending:
                break
            if chunk is None:
                return None
            start = self._pos
            stop = min(start + self.batch_records, len(chunk))
            if self.pace > 0:
                stop = await self._paced_stop(chunk, start, stop)
            else:
                await asyncio.sleep(0)  # let other tasks run between batches
            self._pos = stop
            records = chunk[start:stop]
            self._count_read(records)
            records, events = self._screen(records)
            self._pending.extend(events)
            if len(records):
                self.counters.batches += 1
                self.counters.records += len(records)
                self._pending.append(RecordBatch(records, time.time_ns()))
        return self._pending.popleft()

    def _count_read(self, records: np.ndarray) -> None:
        """Records read from the files (one transport message each), passed on or not."""
        self.counters.messages += len(records)
        self.counters.bytes += records.nbytes

    async def _paced_stop(self, chunk: np.ndarray, start: int, stop: int) -> int:
        """Sleep until the record at ``start`` is due; return the end of the due run (<= stop)."""
        ts = chunk["ts_recv"]
        first = int(ts[start])
        if self._t0_ts_ns is None:
            self._t0_ts_ns = first
            self._t0_wall_ns = time.monotonic_ns()
        due_in_s = (first - self._t0_ts_ns) / self.pace / 1e9 - (time.monotonic_ns() - self._t0_wall_ns) / 1e9
        if due_in_s > 0:
            await asyncio.sleep(due_in_s)
        else:
            await asyncio.sleep(0)
        elapsed_ns = time.monotonic_ns() - self._t0_wall_ns
        cutoff = self._t0_ts_ns + int(elapsed_ns * self.pace)
        due = int(np.searchsorted(ts[start:stop], np.uint64(cutoff), side="right"))
        return start + max(due, 1)
