"""Where a restarted publisher resumes: past the last record a stream holds of each instrument.

A relay restarted on the same files must not publish again what the stream already holds (that
would send every consumer's clock back). It reads the stream's last record of each instrument
(a :class:`ResumePoint`) and hands them to its source (:meth:`feeds.sources.Source.resume_after`)
as a :class:`ResumeFilter`, which drops, per instrument, every record up to and including that
last one: by ``ts_recv``, and among the records of that same ``ts_recv`` by the record's bytes.
The source applies it where the records enter it, before anything else: a paced replay drops the
records before its pacing, so they cost no time and publishing resumes at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import numpy as np

from feeds.dbn.framing import take_mbp10

__all__ = ["ResumeFilter", "ResumePoint"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ResumePoint:
    """The last record a stream holds of one instrument."""

    instrument_id: int
    symbol: str
    ts_recv: int
    record: bytes
    """The record's bytes (one :data:`feeds.records.MBP10_DTYPE` record)."""


class ResumeFilter:
    """Drops the records at or before each instrument's :class:`ResumePoint` (see the module
    docstring); ``skipped`` counts them. An instrument's point is done with at its own record or
    at the first later one (then a warning: the stream's last record is not in the source), and
    the filter is :attr:`done` when every point is."""

    def __init__(self, name: str, points: Iterable[ResumePoint]) -> None:
        self.name = name
        self.skipped = 0
        self._points = {point.instrument_id: point for point in points}

    @property
    def done(self) -> bool:
        return not self._points

    def apply(self, records: np.ndarray) -> np.ndarray:
        """``records`` without those the stream already holds."""
        if not self._points or not len(records):
            return records
        ids = records["instrument_id"]
        keep = np.ones(len(records), dtype=bool)
        for instrument_id, point in list(self._points.items()):
            mine = np.flatnonzero(ids == instrument_id)
            if not len(mine):
                continue
            ts = records["ts_recv"][mine]
            skip = ts < point.ts_recv
            found = False
            for k in np.flatnonzero(ts == point.ts_recv).tolist():
                skip[k] = True
                if records[mine[k]].tobytes() == point.record:
                    found = True
                    break
            keep[mine[skip]] = False
            if found or bool((ts > point.ts_recv).any()):
                del self._points[instrument_id]
                if not found:
                    log.warning(
                        "%s: the stream's last %s record (ts_recv %d) is not in the source; "
                        "publishing its records after that time",
                        self.name,
                        point.symbol,
                        point.ts_recv,
                    )
        skipped = len(records) - int(np.count_nonzero(keep))
        if not skipped:
            return records
        self.skipped += skipped
        if not self._points:
            log.info("%s: resumed; %d records the stream already held were skipped", self.name, self.skipped)
        return take_mbp10(records, keep)
