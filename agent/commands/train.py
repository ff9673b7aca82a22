"""``tradeagent train``: walk-forward training over a recorded archive, gates, promotion.

Exit codes: 0 when the run finished (promoted, kept as a candidate, rejected or halted: the JSON
summary says which), 2 for errors a user can fix (bad data, bad configuration, database down),
3 when ``--max-minutes`` ran out (nothing registered, no candidate, the summary says
``timed_out``). Progress bars go to stderr; with ``--json`` stdout carries exactly the summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import msgspec
from rich.console import Console

from agent.commands.progress import RichProgress
from agent.config import Config, load_config
from agent.errors import CommandError
from agent.reports.page import write_atomic
from agent.train.errors import TrainTimeout
from agent.train.report import write_report
from agent.train.run import TrainRequest, TrainSummary, run_training

__all__ = ["register"]

EXIT_TIMEOUT = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("train", help="walk-forward training with gates and safe promotion")
    parser.add_argument("--data", required=True, metavar="DIR", help="DBN file or directory of daily files")
    parser.add_argument(
        "--instruments", nargs="+", metavar="SYMBOL", help="configured symbols to train on (default: all)"
    )
    parser.add_argument("--promote", action="store_true", help="promote the candidate if every gate passes")
    parser.add_argument("--max-minutes", type=float, metavar="N", help="stop cleanly after N minutes")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="override the configured device")
    parser.add_argument("--seed", type=int, help="override the configured seed")
    parser.add_argument("--summary", metavar="PATH", help="JSON summary (default: <data_dir>/reports/)")
    parser.add_argument("--report", metavar="PATH", help="HTML report (default: <data_dir>/reports/)")
    parser.add_argument("--json", action="store_true", help="print the JSON summary on stdout")
    parser.set_defaults(func=_run)


def _config(args: argparse.Namespace) -> Config:
    config = load_config(args.config)
    changes: dict[str, object] = {}
    if args.device:
        changes["device"] = args.device
    if args.seed is not None:
        changes["seed"] = args.seed
    return msgspec.structs.replace(config, **changes) if changes else config


def _run(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise CommandError("--max-minutes must be > 0")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    reports = Path(config.data_dir) / "reports"
    summary_path = Path(args.summary) if args.summary else reports / f"train-{stamp}.json"
    report_path = Path(args.report) if args.report else reports / f"train-{stamp}.html"
    instruments = [s for item in args.instruments or [] for s in item.split(",") if s] or None
    deadline = time.monotonic() + args.max_minutes * 60.0 if args.max_minutes else None
    request = TrainRequest(
        data=Path(args.data), instruments=instruments, promote=args.promote, deadline=deadline
    )
    console = Console(stderr=True)
    try:
        with RichProgress(console) as bars:
            result = run_training(config, request, bars)
    except TrainTimeout as exc:
        summary = TrainSummary(timed_out=True, halt_reason=str(exc), seed=config.seed)
        write_atomic(summary_path, msgspec.json.encode(summary).decode() + "\n")
        if args.json:
            sys.stdout.write(msgspec.json.encode(summary).decode() + "\n")
        console.print(f"train: time limit reached ({exc}); nothing was registered. Summary: {summary_path}")
        return EXIT_TIMEOUT
    summary = result.summary
    text = msgspec.json.encode(summary).decode()
    write_atomic(summary_path, json.dumps(json.loads(text), indent=1) + "\n")
    write_report(result, report_path)
    if args.json:
        sys.stdout.write(text + "\n")
    else:
        state = "promoted" if summary.promoted else ("halted" if summary.halted else summary.candidate_status)
        print(f"run {summary.run_id}: {state}; candidate {summary.candidate_sha256 or '-'}")
        for fold in summary.folds:
            base = ", ".join(f"{k} {v.pnl:,.2f}" for k, v in fold.baselines.items())
            t = fold.as_traded
            print(
                f"  fold {fold.index} [{fold.test_from} .. {fold.test_to}): as traded P&L {t.pnl:,.2f}, "
                f"Sharpe {t.sharpe:.2f}, PSR {t.psr:.3f} (baselines P&L: {base}; "
                f"greedy one-contract P&L {fold.greedy_unit.pnl:,.2f})"
            )
        if summary.gate is not None and not summary.gate.passed:
            for reason in summary.gate.reasons:
                print(f"  not promoted: {reason}")
        if summary.halt_reason:
            print(f"  halt: {summary.halt_reason}")
    console.print(f"summary: {summary_path}\nreport:  {report_path}")
    return 0
