"""Multi-instrument MBP-10 test feeds written as real DBN files (Databento's encoder layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from feeds.dbn import write_mbp10
from tests.feeds.recbuild import random_book

__all__ = ["DATASET", "NS_PER_DAY", "SYMBOLS", "feed_records", "sorted_by_key", "write_feed"]

DATASET = "GLBX.MDP3"
SYMBOLS = {1001: "ES", 1002: "NQ"}
NS_PER_DAY = 86_400 * 1_000_000_000


def feed_records(n_per_instrument: int, *, seed: int = 0, next_day_from: float | None = None) -> np.ndarray:
    """ES (1001) and NQ (1002) random-walk books interleaved in ``ts_recv`` order.

    With ``next_day_from = f`` the records after fraction ``f`` of the feed move one day later
    (an overnight gap), so a recorder has to rotate files.
    """
    parts = [random_book(n_per_instrument, seed=seed + k, instrument_id=iid) for k, iid in enumerate(SYMBOLS)]
    records = np.concatenate(parts)
    records = records[np.argsort(records["ts_recv"], kind="stable")]
    if next_day_from is not None:
        cut = int(len(records) * next_day_from)
        for field in ("ts_recv", "ts_event"):
            records[field][cut:] += np.uint64(NS_PER_DAY)
    return records


def write_feed(path: Path, records: np.ndarray) -> Path:
    """Write ``records`` as one DBN file (zstd when ``path`` ends in ``.zst``)."""
    ts = records["ts_recv"]
    return write_mbp10(
        path,
        records,
        dataset=DATASET,
        symbols=SYMBOLS,
        start_ns=int(ts[0]),
        end_ns=int(ts[-1]) + 1,
    )


def sorted_by_key(records: np.ndarray) -> np.ndarray:
    """Records in (ts_recv, instrument_id, sequence) order: a canonical order for comparing
    feeds whose instruments were split apart and merged again."""
    order = np.lexsort((records["sequence"], records["instrument_id"], records["ts_recv"]))
    return records[order]
