"""Loading the recorded archive into per-instrument bars for training.

The archive is a DBN file or a directory of daily ``.dbn``/``.dbn.zst`` files (what the recorder
and ``tradeagent synth`` write). Each file is decoded with Databento's libraries
(:mod:`feeds.dbn`) and turned into bars and causal features by :func:`feeds.features.compute_all`
one file at a time, so memory holds one day of records, not the archive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.execution.fills import order_schedule
from agent.train.env import InstrumentBars
from agent.train.errors import TrainError
from feeds.config import FeedsConfig, InstrumentSpec
from feeds.dbn import dbn_files, read_mbp10, read_metadata
from feeds.errors import UnknownInstrument
from feeds.features import BarFrame, compute_all

__all__ = ["load_archive", "select_instruments"]


def select_instruments(feeds: FeedsConfig, symbols: Sequence[str] | None) -> list[InstrumentSpec]:
    """The configured instruments named by ``symbols`` (all configured ones when None)."""
    specs = {s.symbol: s for s in feeds.instruments}
    if not symbols:
        return list(specs.values())
    unknown = [s for s in symbols if s not in specs]
    if unknown:
        raise UnknownInstrument(
            f"instrument(s) {', '.join(unknown)} are not configured (known: {', '.join(specs)})"
        )
    return [specs[s] for s in dict.fromkeys(symbols)]


def load_archive(
    path: str | Path,
    feeds: FeedsConfig,
    instruments: Sequence[InstrumentSpec],
    *,
    fee_per_contract: float,
    latency_ms: float,
    close_grace_ns: int,
    on_file: Callable[[Path], None] | None = None,
) -> dict[str, InstrumentBars]:
    """Bars of ``instruments`` from every DBN file under ``path``, in time order, each with the
    best bid and ask of the book an order sent when the bar is decided meets ``latency_ms``
    later (the paper broker's rule, the daemon's moment of decision with its ``close_grace_ns``:
    :func:`agent.execution.fills.order_schedule`).

    Raises :class:`TrainError` when an instrument has no bar at all, and the feeds errors
    (``DBNFormatError``) for unreadable input. ``on_file`` is called after each file.
    """
    files = dbn_files(path)
    frames: dict[str, list[BarFrame]] = {spec.symbol: [] for spec in instruments}
    books: dict[str, list[np.ndarray[Any, Any]]] = {spec.symbol: [] for spec in instruments}
    for file in files:
        known = set(read_metadata(file).symbols.values())
        wanted = [spec for spec in instruments if spec.symbol in known or not known]
        if wanted:
            records = read_mbp10(file)
            result = compute_all(records, wanted, feeds.bars, feeds.health)
            for spec in wanted:
                frame = result.frames[spec.symbol]
                if len(frame):
                    frames[spec.symbol].append(frame)
                    rows = order_schedule(
                        records,
                        spec.instrument_id,
                        frame.close_index,
                        frame.ts_close,
                        latency_ms,
                        bars=feeds.bars,
                        grace_ns=close_grace_ns,
                    ).rows
                    books[spec.symbol].append(
                        np.stack([records["bid_px_00"][rows], records["ask_px_00"][rows]]).astype(np.int64)
                    )
        if on_file is not None:
            on_file(file)
    out: dict[str, InstrumentBars] = {}
    for spec in instruments:
        if not frames[spec.symbol]:
            raise TrainError(f"{path}: no bars for instrument {spec.symbol} (id {spec.instrument_id})")
        frame = BarFrame.concat(frames[spec.symbol])
        order = np.argsort(frame.ts_close, kind="stable")
        if not np.array_equal(order, np.arange(order.shape[0])):
            raise TrainError(f"{path}: the bars of {spec.symbol} are not in time order across files")
        bid, ask = np.concatenate(books[spec.symbol], axis=1)
        out[spec.symbol] = InstrumentBars.from_frame(
            frame, spec, fee_per_contract, exec_bid=bid, exec_ask=ask
        )
    return out
