"""``tradeagent demo``: synthesise a small dataset and summarise its causal bar features.

Writes ``--days`` synthetic MBP-10 daily files for every configured instrument into ``--out``
(default ``./demo-out``), reads them back with the project's DBN reader, builds bars and features
per instrument (:func:`feeds.features.compute_bars`) and prints two tables: per feature the mean,
standard deviation, minimum and maximum over the tradable bars, and per instrument the records,
bars, tradable share and health episodes. Progress goes to stderr; with ``--json`` stdout carries
one JSON object with the same figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.config import load_config
from agent.errors import CommandError
from feeds.dbn import read_mbp10
from feeds.features import FEATURE_NAMES, compute_bars
from feeds.health import HealthMonitor
from feeds.synth import write_synthetic

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="synthesise a small dataset and summarise its features")
    parser.add_argument(
        "--out", default="demo-out", metavar="DIR", help="output directory (default: ./demo-out)"
    )
    parser.add_argument("--days", type=int, default=2, help="trading days to synthesise (default: 2)")
    parser.add_argument("--seed", type=int, help="random seed (default: the configuration's seed)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.set_defaults(func=_run)


def _feature_summary(features: np.ndarray) -> list[dict[str, Any]]:
    """Mean, std, min, max per feature over the rows of ``features`` (float32 ``(n, F)``)."""
    data = features.astype(np.float64)
    empty = data.shape[0] == 0
    return [
        {
            "feature": name,
            "mean": 0.0 if empty else float(data[:, j].mean()),
            "std": 0.0 if empty else float(data[:, j].std()),
            "min": 0.0 if empty else float(data[:, j].min()),
            "max": 0.0 if empty else float(data[:, j].max()),
        }
        for j, name in enumerate(FEATURE_NAMES)
    ]


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.days < 1:
        raise CommandError(f"--days must be at least 1, got {args.days}")
    synth = msgspec.structs.replace(config.synth, days=args.days)
    seed = config.seed if args.seed is None else args.seed
    instruments = list(config.feeds.instruments)
    out = Path(args.out)
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("synthesise", total=synth.days)

        def on_day(day: dt.date, records: int) -> None:
            progress.update(task, advance=1, description=f"synthesise {day:%Y-%m-%d} ({records:,} records)")

        write_synthetic(out, instruments=instruments, synth=synth, seed=seed, on_day=on_day)
        records = read_mbp10(out)
        task = progress.add_task("features", total=len(instruments))
        per_instrument: list[dict[str, Any]] = []
        tradable_rows: list[np.ndarray] = []
        for spec in instruments:
            progress.update(task, description=f"features {spec.symbol}")
            monitor = HealthMonitor(spec.instrument_id, spec.symbol)
            frame = compute_bars(records, spec, config.feeds.bars, config.feeds.health, monitor)
            tradable_rows.append(frame.features[frame.tradable])
            per_instrument.append(
                {
                    "symbol": spec.symbol,
                    "records": int(np.count_nonzero(records["instrument_id"] == spec.instrument_id)),
                    "bars": len(frame),
                    "tradable_share": float(frame.tradable.mean()) if len(frame) else 0.0,
                    "health_episodes": len(monitor.episodes),
                }
            )
            progress.advance(task)
    features = _feature_summary(np.concatenate(tradable_rows))
    if args.json:
        summary = {"out": str(out), "features": features, "instruments": per_instrument}
        sys.stdout.write(json.dumps(summary) + "\n")
        return 0
    stdout = Console()
    table = Table(title=f"Features over tradable bars ({config.feeds.bars.clock} bars)")
    for name in ("feature", "mean", "std", "min", "max"):
        table.add_column(name, justify="left" if name == "feature" else "right")
    for row in features:
        table.add_row(row["feature"], *(f"{row[k]:.4g}" for k in ("mean", "std", "min", "max")))
    stdout.print(table)
    table = Table(title=f"Instruments (data in {out})")
    for name in ("symbol", "records", "bars", "tradable", "health episodes"):
        table.add_column(name, justify="left" if name == "symbol" else "right")
    for row in per_instrument:
        table.add_row(
            row["symbol"],
            f"{row['records']:,}",
            f"{row['bars']:,}",
            f"{row['tradable_share']:.1%}",
            str(row["health_episodes"]),
        )
    stdout.print(table)
    return 0
