"""``tradeagent backtest``: replay recorded days through the daemon's pipeline (or the vectorised
driver with ``--fast``), then write an HTML report and a JSON summary.

Inputs are checked before any work: an output directory that cannot be written, a missing or
empty data directory, dates outside the data, a checkpoint that does not exist or does not match
the data's features end with a clear error and exit code 2, and nothing is written.
``--instruments`` trades a subset of the configured instruments, as ``train --instruments``
trains one: ``--checkpoint promoted`` is then the promoted model of that subset. Outputs are
written tmp-then-rename. Progress bars go to stderr; with ``--json`` stdout carries exactly the
summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import msgspec
from rich.console import Console

from agent.backtest.api import FAST_CHUNKS, BacktestRequest, run_backtest
from agent.backtest.inputs import parse_bound
from agent.commands.outputs import output_dir
from agent.commands.progress import RichProgress
from agent.commands.train import symbols_of
from agent.config import load_config
from agent.errors import CommandError
from agent.reports.backtest import write_backtest
from agent.train.data import select_instruments

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("backtest", help="replay recorded days through the pipeline; report")
    parser.add_argument("--data", required=True, metavar="DIR", help="DBN file or directory of daily files")
    parser.add_argument(
        "--checkpoint",
        default="promoted",
        metavar="promoted|SHA256|PATH",
        help="the model to trade (default: the promoted one for the configured instruments)",
    )
    parser.add_argument(
        "--instruments",
        nargs="+",
        metavar="SYMBOL",
        help="configured symbols to trade, as `train --instruments` (default: all)",
    )
    parser.add_argument(
        "--from",
        dest="date_from",
        metavar="WHEN",
        help="start: a UTC date YYYY-MM-DD (its first instant) or an ISO date-time (included)",
    )
    parser.add_argument(
        "--to",
        dest="date_to",
        metavar="WHEN",
        help="end: a UTC date YYYY-MM-DD (the day included) or an ISO date-time (excluded)",
    )
    parser.add_argument(
        "--fast", action="store_true", help="vectorised driver instead of the daemon pipeline"
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=FAST_CHUNKS,
        metavar="N",
        help=f"--fast: spans per instrument in lockstep (default {FAST_CHUNKS}; 1 = exact event parity)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="override the configured device")
    parser.add_argument(
        "--out", metavar="DIR", help="output directory (default: <data_dir>/reports/backtest-*)"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON summary on stdout")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.device:
        config = msgspec.structs.replace(config, device=args.device)
    if args.chunks < 1:
        raise CommandError(f"--chunks must be >= 1, got {args.chunks}")
    symbols = symbols_of(args.instruments)
    if symbols:
        feeds = msgspec.structs.replace(
            config.feeds, instruments=tuple(select_instruments(config.feeds, symbols))
        )
        config = msgspec.structs.replace(config, feeds=feeds)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = output_dir("--out", args.out or Path(config.data_dir) / "reports" / f"backtest-{stamp}")
    request = BacktestRequest(
        data=Path(args.data),
        checkpoint=args.checkpoint,
        start_ns=parse_bound(args.date_from, "--from", end=False) if args.date_from else None,
        end_ns=parse_bound(args.date_to, "--to", end=True) if args.date_to else None,
        fast=args.fast,
        chunks=args.chunks,
    )
    console = Console(stderr=True)
    with RichProgress(console) as progress:
        result = run_backtest(config, request, progress)
    report, summary_path = write_backtest(result, out)
    s = result.summary
    if args.json:
        sys.stdout.write(msgspec.json.encode(s).decode() + "\n")
    else:
        p = s.performance
        print(
            f"{s.mode} backtest {s.first_day} .. {s.last_day}: P&L {p.pnl:,.2f} after costs {p.costs:,.2f}, "
            f"Sharpe {p.sharpe:.2f}, max drawdown {p.max_drawdown:,.2f}, {s.fills:,} fills"
        )
        for name, b in s.baselines.items():
            print(f"  baseline {name:<6} P&L {b.pnl:>12,.2f}  Sharpe {b.sharpe:6.2f}")
    console.print(f"report:  {report}\nsummary: {summary_path}")
    return 0
