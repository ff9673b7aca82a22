"""The vectorised path (replay, training): bars and features of whole arrays of records.

:func:`compute_bars` / :func:`compute_all` evaluate the statistics of a group of whole bars of
about :data:`_GROUP_RECORDS` records at a time with :func:`feeds.features.group_statistics.bar_statistics`
(a small carry links the groups) and turn them into features with
:func:`feeds.features.frame.bar_frames`; :class:`FeatureStream` and :func:`compute_file` do
the same over records that arrive in chunks (a file read in bounded memory), holding the open
bar's records back.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from feeds.bars import BarPlan, plan_bars
from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.dbn.framing import mbp10_header_ok
from feeds.dbn.reader import iter_mbp10
from feeds.features.frame import BarFrame, bar_frames
from feeds.features.group_statistics import RECORD_WORDS, Carry, bar_statistics
from feeds.features.statistics import check_records, stale_interval_ns
from feeds.health import HealthMonitor
from feeds.records import MBP10_DTYPE

__all__ = [
    "FILE_CHUNK_RECORDS",
    "Closes",
    "FeatureSet",
    "FeatureStream",
    "compute_all",
    "compute_bars",
    "compute_file",
]

_NO_ID = -1
"""The instrument id :class:`FeatureStream` gives a record that is not MBP-10 (real ids are
uint32)."""


class Closes(NamedTuple):
    """The bars one chunk closed for one instrument (:meth:`FeatureStream.push`), int64 each."""

    close_index: np.ndarray
    """Their :attr:`BarFrame.close_index` (ascending)."""
    close_ts: np.ndarray
    """Their close times (:attr:`BarFrame.ts_close`)."""


_NONE = np.zeros(0, np.int64)
_NONE.flags.writeable = False
_NO_CLOSES = Closes(_NONE, _NONE)
_GROUP_RECORDS = 1 << 15
"""The vectorised path runs :func:`bar_statistics` over groups of whole bars of about this many
records (~12 MB): each group's records are gathered from the chunk just before it reads them,
so they are still in cache (gathering a whole chunk first made every later strided read a
miss), and the carry makes the grouping invisible. Fewer, larger groups spend less on each
group's ~150 NumPy calls: ``load_bars`` on the 1M-record bench file, alternating in one process
(medians), 0.632 s at 8,192 records, 0.534 at 16,384 and 0.509 at 32,768 on an H200 host;
0.565, 0.516 and 0.521 on a 2-core machine (its peak 406 -> 431 MB)."""
FILE_CHUNK_RECORDS = 1 << 16
""":func:`compute_file` reads this many records at a time by default (24 MiB)."""


class _InstrumentStream:
    """The vectorised path for one instrument over records that arrive in chunks: the carry of
    :func:`bar_statistics`, and the records of the open bar (held back until a later chunk closes it)."""

    def __init__(
        self, spec: InstrumentSpec, bars: BarConfig, health: HealthConfig, monitor: HealthMonitor
    ) -> None:
        self.spec = spec
        self.monitor = monitor
        self._bars = bars
        self._health = health
        self._stale_ns = stale_interval_ns(health)
        self._carry = Carry()
        self._tail = np.empty(0, MBP10_DTYPE)  # the open bar's records
        self._tail_index = np.empty(0, np.int64)  # their positions in the stream
        self._clock_before = 0  # running maximum of ts_recv before the open bar
        self._frames: list[BarFrame] = []

    def push(self, chunk: np.ndarray, positions: np.ndarray | None, offset: int) -> Closes:
        """Add this instrument's records of ``chunk`` (contiguous :data:`MBP10_DTYPE`): all of
        them when ``positions`` is ``None``, else ``chunk[positions]``. ``offset`` is the
        chunk's position in the stream (for ``close_index``). Returns the bars it closed."""
        local = np.arange(len(chunk), dtype=np.int64) if positions is None else positions
        if not len(local):
            return _NO_CLOSES
        closed = len(self._frames)
        tail = self._tail
        index = np.concatenate((self._tail_index, local + offset))
        mine = chunk["ts_recv"] if positions is None else chunk["ts_recv"][positions]
        ts = np.concatenate((tail["ts_recv"], mine)).astype(np.int64)
        clock = np.maximum.accumulate(np.maximum(ts, self._clock_before))
        plan = plan_bars(clock, self._bars, self._stale_ns)
        n_bars = plan.ends.shape[0]
        used = int(plan.ends[-1]) if n_bars else 0
        if n_bars:
            targets = np.arange(_GROUP_RECORDS, used, _GROUP_RECORDS)
            cuts = np.unique(np.searchsorted(plan.ends, targets, side="left") + 1)
            bounds = [0, *cuts[cuts < n_bars].tolist(), n_bars]
            for b0, b1 in itertools.pairwise(bounds):
                r0 = int(plan.ends[b0 - 1]) if b0 else 0
                r1 = int(plan.ends[b1 - 1])
                part = BarPlan(ends=plan.ends[b0:b1] - r0, close_ts=plan.close_ts[b0:b1])
                stats, self._carry = bar_statistics(
                    _gather(tail, chunk, positions, r0, r1),  # gathered just before use: in cache
                    part,
                    self._carry,
                    spec=self.spec,
                    health=self._health,
                    monitor=self.monitor,
                    index_base=index[r0:r1],
                    ts=ts[r0:r1],
                    clock=clock[r0:r1],
                )
                self._frames.extend(bar_frames([(self.spec, b1 - b0)], stats))
            self._clock_before = int(clock[used - 1])
        self._tail = _gather(tail, chunk, positions, used, len(index))
        self._tail_index = index[used:]
        new = self._frames[closed:]
        if not new:
            return _NO_CLOSES
        if len(new) == 1:
            return Closes(new[0].close_index, new[0].ts_close)
        return Closes(np.concatenate([f.close_index for f in new]), np.concatenate([f.ts_close for f in new]))

    def frame(self) -> BarFrame:
        """The bars closed so far (the open bar's records are not used)."""
        frames = self._frames
        if not frames:
            return BarFrame.empty(self.spec.instrument_id, self.spec.symbol)
        if len(frames) > 1:
            self._frames = [BarFrame.concat(frames)]
        return self._frames[0]


def _gather(
    tail: np.ndarray, chunk: np.ndarray, positions: np.ndarray | None, r0: int, r1: int
) -> np.ndarray:
    """Records ``[r0, r1)`` of ``tail`` followed by ``chunk[positions]`` (all of ``chunk`` when
    ``None``), contiguous: a view when they lie in one of the two, else one new array; records
    move as int64 words (NumPy moves structured rows field by field)."""
    n_tail = len(tail)
    head = tail[min(r0, n_tail) : min(r1, n_tail)]
    begin, end = max(r0 - n_tail, 0), max(r1 - n_tail, 0)
    if begin == end:
        return head
    if positions is None and not len(head):
        return chunk[begin:end]
    n_head = len(head)
    out = np.empty(n_head + end - begin, MBP10_DTYPE)
    words = out.view(np.int64).reshape(len(out), RECORD_WORDS)
    words[:n_head] = head.view(np.int64).reshape(n_head, RECORD_WORDS)
    source = chunk.view(np.int64).reshape(len(chunk), RECORD_WORDS)
    if positions is None:
        words[n_head:] = source[begin:end]
    else:
        np.take(source, positions[begin:end], axis=0, out=words[n_head:], mode="clip")  # valid by
        # construction; mode 'raise' would buffer the output
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class FeatureSet:
    """:func:`compute_all`'s result: a frame and a health monitor per configured symbol, and
    the records that were rejected (unknown instrument id, or not an MBP-10 record)."""

    frames: dict[str, BarFrame]
    monitors: dict[str, HealthMonitor]
    rejected_records: int


@functools.cache
def _workers() -> ThreadPoolExecutor:
    """The threads on which :class:`FeatureStream` runs its instruments side by side (each
    instrument's stream is its own state). Most of an instrument's work is NumPy calls on
    thousands of records, which release the interpreter lock: on a 16-core host the 1M-record
    bench file of two instruments took 0.50 s against 0.56 s one instrument after the other
    (medians of ten); on a 2-core machine, where the reading thread takes the other core, the
    same."""
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="features")


os.register_at_fork(after_in_child=_workers.cache_clear)  # a forked child has none of the threads


class FeatureStream:
    """The vectorised path over a stream of record chunks (a file or an archive read in bounded
    memory): :meth:`push` each chunk in arrival order, then :meth:`result`. The bars and
    features do not depend on how the records are cut into chunks; :func:`compute_all` is one
    chunk. Records of an instrument that is not configured, or not MBP-10, are counted. The
    instruments of a chunk are computed side by side (:func:`_workers`)."""

    def __init__(self, instruments: Iterable[InstrumentSpec], bars: BarConfig, health: HealthConfig) -> None:
        self._streams = [
            _InstrumentStream(spec, bars, health, HealthMonitor(spec.instrument_id, spec.symbol))
            for spec in instruments
        ]
        self._offset = 0
        self._rejected = 0

    def push(self, records: np.ndarray) -> dict[int, Closes]:
        """Add the next chunk (1-D :data:`MBP10_DTYPE`, any instruments, arrival order); returns,
        per instrument id, the bars it closed."""
        return self.start(records)()

    def start(self, records: np.ndarray) -> Callable[[], dict[int, Closes]]:
        """:meth:`push` without waiting: the instruments' features of the chunk are computed on
        the worker threads while the caller goes on; the returned waiter gives :meth:`push`'s
        result. Call it before the next :meth:`start` or :meth:`result`."""
        check_records(records)
        chunk = np.ascontiguousarray(records)  # bar_statistics views records as int64 words
        ids = chunk["instrument_id"].astype(np.int64)  # read once, then contiguous
        ids[~mbp10_header_ok(chunk)] = _NO_ID
        offset = self._offset
        masks = [ids == stream.spec.instrument_id for stream in self._streams]
        valid = np.logical_or.reduce(masks) if masks else np.zeros(chunk.shape[0], bool)
        self._rejected += int(chunk.shape[0] - np.count_nonzero(valid))
        self._offset += chunk.shape[0]

        def push(stream: _InstrumentStream, mine: np.ndarray) -> Closes:
            return stream.push(chunk, None if mine.all() else np.flatnonzero(mine), offset)

        if len(self._streams) > 1:
            futures = [
                _workers().submit(push, stream, mine)
                for stream, mine in zip(self._streams, masks, strict=True)
            ]
            return lambda: {
                s.spec.instrument_id: f.result() for s, f in zip(self._streams, futures, strict=True)
            }
        closed = {s.spec.instrument_id: push(s, mine) for s, mine in zip(self._streams, masks, strict=True)}
        return lambda: closed

    def result(self) -> FeatureSet:
        """The bars closed so far, a health monitor per symbol, and the rejected records."""
        return FeatureSet(
            {s.spec.symbol: s.frame() for s in self._streams},
            {s.spec.symbol: s.monitor for s in self._streams},
            self._rejected,
        )


def compute_bars(
    records: np.ndarray,
    instrument: InstrumentSpec,
    bars: BarConfig,
    health: HealthConfig,
    monitor: HealthMonitor | None = None,
) -> BarFrame:
    """The closed bars and features of ``instrument`` in ``records`` (vectorised path).

    ``records``: 1-D :data:`MBP10_DTYPE` array in arrival order; it may interleave
    instruments (only ``instrument.instrument_id`` is used). Health episodes and counters go to
    ``monitor`` (a fresh one when ``None``). The records after the last closed bar (the open
    bar) are not used.
    """
    check_records(records)
    chunk = np.ascontiguousarray(records)
    stream = _InstrumentStream(
        instrument, bars, health, monitor or HealthMonitor(instrument.instrument_id, instrument.symbol)
    )
    mine = (chunk["instrument_id"] == instrument.instrument_id) & mbp10_header_ok(chunk)
    stream.push(chunk, None if mine.all() else np.flatnonzero(mine), 0)
    return stream.frame()


def compute_all(
    records: np.ndarray,
    instruments: Iterable[InstrumentSpec],
    bars: BarConfig,
    health: HealthConfig,
) -> FeatureSet:
    """:func:`compute_bars` for every configured instrument in ``records`` (interleaved)."""
    stream = FeatureStream(instruments, bars, health)
    stream.push(records)
    return stream.result()


def compute_file(
    path: str | Path,
    instruments: Iterable[InstrumentSpec],
    bars: BarConfig,
    health: HealthConfig,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    chunk_records: int = FILE_CHUNK_RECORDS,
) -> FeatureSet:
    """:func:`compute_all` over a DBN file or a directory of daily files (time-disjoint, as
    :func:`feeds.dbn.iter_mbp10` reads them), decoded and processed ``chunk_records`` records
    at a time (the next ones decoded meanwhile by a background thread): memory stays bounded
    by a few chunks plus the bars. ``start_ns``/``end_ns`` keep
    ``start_ns <= ts_recv < end_ns``. ``close_index`` counts records from the first one kept.
    Raises :class:`~feeds.errors.DBNFormatError` on unreadable files."""
    stream = FeatureStream(instruments, bars, health)
    for chunk in iter_mbp10(path, chunk_records=chunk_records, start_ns=start_ns, end_ns=end_ns, ahead=1):
        stream.push(chunk)
    return stream.result()
