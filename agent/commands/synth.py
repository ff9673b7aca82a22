"""``tradeagent synth``: write synthetic MBP-10 DBN daily files (the model is in ``feeds/synth.py``).

Options override the ``[synth]`` configuration section; instruments come from
``feeds.instruments`` (``--instruments`` picks a subset by symbol). One ``.dbn.zst`` file per
trading day under ``--out`` (checked writable before any work); a progress bar per day goes to
stderr, and the list of files to stdout (one JSON object with ``--json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent.commands.outputs import output_dir
from agent.config import load_config
from agent.errors import CommandError
from feeds.config import InstrumentSpec, SynthConfig
from feeds.errors import UnknownInstrument
from feeds.synth import write_synthetic

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("synth", help="write synthetic MBP-10 DBN daily files")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--days", type=int, help="trading days to write (default: synth.days)")
    parser.add_argument(
        "--instruments", metavar="SYMBOLS", help="comma-separated symbols of feeds.instruments (default: all)"
    )
    parser.add_argument("--seed", type=int, help="random seed (default: the configuration's seed)")
    parser.add_argument(
        "--signal", type=float, help="planted signal strength; 0 = no edge (default: synth.signal)"
    )
    parser.add_argument("--start", metavar="YYYY-MM-DD", help="first trading day (default: synth.start_date)")
    parser.add_argument("--events-per-second", type=float, metavar="R", help="base event rate per instrument")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.set_defaults(func=_run)


def _synth_config(base: SynthConfig, args: argparse.Namespace) -> SynthConfig:
    overrides: dict[str, Any] = {
        name: value
        for name, value in (
            ("days", args.days),
            ("signal", args.signal),
            ("start_date", args.start),
            ("events_per_second", args.events_per_second),
        )
        if value is not None
    }
    if args.start is not None:
        try:
            dt.date.fromisoformat(args.start)
        except ValueError:
            raise CommandError(f"--start {args.start!r}: not a date (YYYY-MM-DD)") from None
    try:
        return msgspec.convert(msgspec.to_builtins(base) | overrides, SynthConfig)
    except msgspec.ValidationError as exc:
        raise CommandError(f"bad option: {exc}") from None


def _instruments(all_specs: tuple[InstrumentSpec, ...], wanted: str | None) -> list[InstrumentSpec]:
    if wanted is None:
        return list(all_specs)
    by_symbol = {spec.symbol: spec for spec in all_specs}
    symbols = [symbol.strip() for symbol in wanted.split(",") if symbol.strip()]
    unknown = [symbol for symbol in symbols if symbol not in by_symbol]
    if unknown or not symbols:
        raise UnknownInstrument(
            f"--instruments {wanted!r}: unknown {', '.join(unknown) or 'empty list'}; "
            f"configured: {', '.join(by_symbol)}"
        )
    return [by_symbol[symbol] for symbol in dict.fromkeys(symbols)]


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    synth = _synth_config(config.synth, args)
    instruments = _instruments(config.feeds.instruments, args.instruments)
    out = output_dir("--out", args.out)
    seed = config.seed if args.seed is None else args.seed
    started = time.perf_counter()
    total = 0
    console = Console(stderr=True)
    columns = (TextColumn("synth {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(",".join(spec.symbol for spec in instruments), total=synth.days)

        def on_day(day: dt.date, records: int) -> None:
            nonlocal total
            total += records
            progress.update(task, advance=1, description=f"{day:%Y-%m-%d} {records:,} records")

        paths = write_synthetic(out, instruments=instruments, synth=synth, seed=seed, on_day=on_day)
    summary = {
        "files": [str(path) for path in paths],
        "records": total,
        "instruments": [spec.symbol for spec in instruments],
        "seed": seed,
        "signal": synth.signal,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        for path in paths:
            print(path)
        print(f"{total:,} records in {summary['seconds']:.1f} s", file=sys.stderr)
    return 0
