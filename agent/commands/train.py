"""``tradeagent train``: walk-forward training over a recorded archive, gates, promotion.

Exit codes: 0 when the run finished (promoted, kept as a candidate, rejected or halted: the JSON
summary says which), 2 for errors a user can fix (bad data, bad configuration, database down, an
output path that cannot be written, an incumbent that cannot be loaded), 3 when
``--max-minutes`` ran out (nothing registered, no candidate, the summary says ``timed_out``).
Both kinds of error 2 are found before any training: the output paths (``--summary``,
``--report``, the checkpoint store) are checked first, then the incumbent (the promoted
checkpoint the gate compares with) is loaded and verified; ``--no-incumbent`` trains and gates
against no incumbent, which is how a broken one is replaced. ``--data`` defaults to the
recorder's archive (``feeds.recorder.out_dir`` or ``<data_dir>/recordings``), what the nightly
retrain reads. Progress bars go to stderr; with ``--json`` stdout carries exactly the summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

import msgspec
from rich.console import Console

from agent.commands.outputs import output_dir, output_file
from agent.commands.progress import RichProgress
from agent.config import Config, load_config
from agent.errors import CommandError
from agent.reports.page import write_atomic
from agent.reports.training import write_report
from agent.train.errors import IncumbentUnusable, TrainTimeout
from agent.train.summary import TrainSummary
from agent.train.walkforward import TrainRequest, run_training
from storage import CheckpointStore

__all__ = ["register", "symbols_of"]

EXIT_TIMEOUT = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("train", help="walk-forward training with gates and safe promotion")
    parser.add_argument(
        "--data",
        metavar="DIR",
        help="DBN file or directory of daily files (default: the recorder's archive, "
        "feeds.recorder.out_dir or <data_dir>/recordings)",
    )
    parser.add_argument(
        "--instruments", nargs="+", metavar="SYMBOL", help="configured symbols to train on (default: all)"
    )
    parser.add_argument("--promote", action="store_true", help="promote the candidate if every gate passes")
    parser.add_argument(
        "--no-incumbent",
        action="store_true",
        help="gate against no incumbent (baselines only): with --promote, replaces a promoted "
        "checkpoint that cannot be loaded",
    )
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


def symbols_of(values: list[str] | None) -> list[str] | None:
    """The symbols of an ``--instruments`` option (``ES NQ`` or ``ES,NQ``); None when not given."""
    return [s for item in values or [] for s in item.split(",") if s] or None


def _data(args: argparse.Namespace, config: Config) -> Path:
    if args.data:
        return Path(args.data)
    archive = Path(config.feeds.recorder.out_dir or Path(config.data_dir) / "recordings")
    if not archive.is_dir():
        raise CommandError(
            f"--data not given and the recorder's archive {archive} does not exist: "
            "pass --data DIR (or record one with `tradeagent record`)"
        )
    return archive


def _remedy(args: argparse.Namespace, data: Path, exc: IncumbentUnusable) -> CommandError:
    """The unusable-incumbent error with the exact commands that fix it, for this configuration."""
    prefix = "tradeagent" + (f" --config {shlex.quote(args.config)}" if args.config else "")
    retrain = [f"{prefix} train --data {shlex.quote(str(data))}"]
    if args.instruments:
        retrain.append("--instruments " + " ".join(shlex.quote(i) for i in args.instruments))
    return CommandError(
        f"the promoted checkpoint {exc.sha256[:12]} of {exc.instrument_set} cannot be the incumbent: "
        f"{exc.reason}. Nothing was trained. Fix it first: `{prefix} ctl rollback` (the running daemon "
        f"puts the previous promoted checkpoint back), `{prefix} ctl promote <sha256 of a candidate>`, "
        f"or train against no incumbent and promote the result: "
        f"`{' '.join(retrain)} --promote --no-incumbent`"
    )


def _run(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise CommandError("--max-minutes must be > 0")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    reports = Path(config.data_dir) / "reports"
    summary_path = output_file("--summary", args.summary or reports / f"train-{stamp}.json")
    report_path = output_file("--report", args.report or reports / f"train-{stamp}.html")
    output_dir("data_dir (checkpoint store)", CheckpointStore.for_data_dir(config.data_dir).root)
    instruments = symbols_of(args.instruments)
    deadline = time.monotonic() + args.max_minutes * 60.0 if args.max_minutes else None
    data = _data(args, config)
    request = TrainRequest(
        data=data,
        instruments=instruments,
        promote=args.promote,
        deadline=deadline,
        incumbent=not args.no_incumbent,
    )
    console = Console(stderr=True)
    try:
        with RichProgress(console) as bars:
            result = run_training(config, request, bars)
    except IncumbentUnusable as exc:
        raise _remedy(args, data, exc) from None
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
