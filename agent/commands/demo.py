"""``tradeagent demo``: the whole system on embedded defaults, with nothing to provide.

1. **synthesise** a week (five trading days) of MBP-10 data for the configured instruments with
   a planted order-flow signal (real ``.dbn.zst`` files, :mod:`feeds.synth`);
2. **train** walk-forward on all days but the last (a small model and a short schedule: a few
   minutes on a 2-core CPU, the GPU when present), with the trainer's gates; a candidate that
   passes them is **promoted** in the SQLite registry;
3. **backtest** the held-out last day with the model the demo trades (below) and the vectorised
   driver (the same decisions, fill and P&L maths as the daemon's pipeline, windows in lockstep:
   a full day in well under a minute; ``tradeagent backtest`` without ``--fast`` replays it
   record by record instead), with a report and JSON summary next to the flat / random /
   always-long baselines;
4. **paper trading**: start a real ``nats-server`` on a free port, start ``tradeagent run`` (paper
   broker, SQLite ledger, that model) on a NATS JetStream feed, and relay the last day onto
   NATS at ``--pace`` times real time for ``--paper-seconds``; then stop both (SIGTERM: orderly)
   and print what the daemon did and where the reports, the database and the logs are.

**The model the demo trades** (steps 3 and 4) is what is promoted, as ``tradeagent run`` would
trade it: the new candidate when it was promoted; otherwise the promoted incumbent when there is
one (a second run on the same ``--out`` keeps the first run's registry, and its candidate may
lose to that incumbent); when nothing is promoted at all, the unpromoted candidate, labelled so,
to show the last two steps (``tradeagent run`` would not trade it). The console, the final lines
and ``demo-summary.json`` (``traded_sha256``, ``traded_model``) say which model it is.

Everything lands under ``--out`` (default ``./demo-out``, checked writable before any work):
``data/``, ``state/`` (database, checkpoints; its ``nats/`` store is emptied at each start, so a
run never replays an earlier run's stream), ``reports/``, ``logs/`` and the daemon's
``paper.toml``. ``--quick`` shrinks every step (short sessions, a tiny schedule) for the test
suite. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from agent.backtest.api import BacktestRequest, run_backtest
from agent.commands.outputs import output_dir
from agent.commands.progress import RichProgress
from agent.config import Config, load_config
from agent.control.client import ControlClient
from agent.control.endpoints import control_endpoint
from agent.control.errors import ControlError
from agent.errors import CommandError
from agent.reports.backtest import write_backtest
from agent.reports.page import write_atomic
from agent.reports.training import write_report
from agent.train.summary import TrainSummary
from agent.train.walkforward import TrainRequest, run_training
from feeds.config import InstrumentSpec
from feeds.natsd import NatsServer, NatsServerUnavailable
from feeds.sources import config_symbols
from feeds.synth import write_synthetic
from storage import ModelRegistry, open_database

__all__ = ["demo_config", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="synthesise, train, promote, backtest and paper-trade, end to end")
    parser.add_argument(
        "--out", default="demo-out", metavar="DIR", help="output directory (default ./demo-out)"
    )
    parser.add_argument(
        "--days", type=int, help="trading days to synthesise (default 5; the last is held out)"
    )
    parser.add_argument("--seed", type=int, help="random seed (default: the configuration's seed)")
    parser.add_argument("--paper-seconds", type=float, help="how long the paper daemon trades (default 60)")
    parser.add_argument("--pace", type=float, help="replay speed of the last day onto NATS (default 60x)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="override the configured device")
    parser.add_argument("--quick", action="store_true", help="a much smaller run (the test suite uses it)")
    parser.set_defaults(func=_run)


class _Profile(msgspec.Struct, frozen=True, kw_only=True):
    days: int
    paper_seconds: float
    pace: float
    session_minutes: int | None
    """Shorter synthetic sessions (``None``: the configured session hours)."""
    epochs: int
    steps_per_epoch: int


_FULL = _Profile(days=5, paper_seconds=60.0, pace=60.0, session_minutes=None, epochs=4, steps_per_epoch=250)
_QUICK = _Profile(days=3, paper_seconds=20.0, pace=20.0, session_minutes=8, epochs=2, steps_per_epoch=60)


def _short_session(spec: InstrumentSpec, minutes: int) -> InstrumentSpec:
    start = dt.datetime.strptime(spec.session_start, "%H:%M")
    end = (start + dt.timedelta(minutes=minutes)).strftime("%H:%M")
    return msgspec.structs.replace(spec, session_end=end)


def demo_config(base: Config, out: Path, profile: _Profile) -> Config:
    """The demo's configuration: ``base`` with its state under ``out/state``, a small model and a
    short walk-forward schedule (the embedded defaults are sized for real archives)."""
    feeds = base.feeds
    if profile.session_minutes is not None:
        feeds = msgspec.structs.replace(
            feeds, instruments=tuple(_short_session(s, profile.session_minutes) for s in feeds.instruments)
        )
    model = msgspec.structs.replace(
        base.model,
        window=16,
        d_model=32,
        n_layers=1,
        headdim=8,
        d_state=8,
        n_atoms=21,
        v_min=-5.0,
        v_max=5.0,
        return_bins=11,
        return_max_ticks=5.0,
    )
    train = msgspec.structs.replace(
        base.train,
        folds=2,
        train_test_ratio=2.0,
        n_envs=32,
        eval_envs=128,
        epochs=profile.epochs,
        steps_per_epoch=profile.steps_per_epoch,
        batch_size=64,
        replay_capacity=50_000,
        learning_starts=min(500, profile.steps_per_epoch * 32 // 2),
        lr=0.001,
        probe_size=128,
        sharpe_bucket_s=300.0,
    )
    return msgspec.structs.replace(
        base, data_dir=str((out / "state").resolve()), feeds=feeds, model=model, train=train
    )


def _paper_toml(config: Config, nats_url: str, checkpoint: str) -> str:
    """The daemon's configuration file: the demo's instruments, state and model, a NATS feed."""
    instruments = "".join(
        f'\n[[feeds.instruments]]\nsymbol = "{s.symbol}"\ninstrument_id = {s.instrument_id}\n'
        f'tick_size = {s.tick_size}\ntick_value = {s.tick_value}\nsession_start = "{s.session_start}"\n'
        f'session_end = "{s.session_end}"\n'
        for s in config.feeds.instruments
    )
    return (
        "# Written by `tradeagent demo`: the paper daemon on the demo's NATS feed.\n"
        f'data_dir = "{config.data_dir}"\ndevice = "{config.device}"\nseed = {config.seed}\n\n'
        f'[feeds.source]\nkind = "nats"\nnats_url = "{nats_url}"\ndataset = "{config.synth.dataset}"\n'
        'nats_mode = "jetstream"\n\n'
        f'[daemon]\ncheckpoint = "{checkpoint}"\nstale_decision_ms = 5000.0\nstatus_interval_s = 0.5\n\n'
        "[control]\nmetrics_port = 0\n\n[schedule]\nenabled = false\n"
        f"{instruments}"
    )


def _wait_running(client: ControlClient, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CommandError(f"the paper daemon exited with {proc.returncode}; see {log}")
        try:
            if client.request("status").get("state") == "running":
                return
        except ControlError:
            pass
        time.sleep(0.2)
    raise CommandError(f"the paper daemon did not start within {timeout:g} s; see {log}")


def _wait_feed(
    client: ControlClient, relay: subprocess.Popen[bytes], log: Path, timeout: float
) -> dict[str, Any]:
    """Wait until the daemon has received records from the relay; its status then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = client.request("status")
            if status.get("feed", {}).get("records", 0) > 0:
                return status
        except ControlError:
            pass
        if relay.poll() not in (None, 0):
            raise CommandError(f"the relay exited with {relay.returncode}; see {log}")
        time.sleep(0.2)
    raise CommandError(f"no record reached the paper daemon within {timeout:g} s; see {log}")


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    return proc.returncode


def _gated(s: TrainSummary) -> dict[str, Any]:
    """What the promotion gate scored: the candidate's as-traded out-of-sample figures (None
    when training halted before the evaluation), the probabilistic Sharpe of its promotion
    event and the gate's decision."""
    promotion = [g for g in s.gates if g.kind == "promotion"]
    psr = promotion[-1].values.get("psr") if promotion else None
    oos = s.oos
    return {
        "passed": bool(s.gate and s.gate.passed),
        "reasons": list(s.gate.reasons) if s.gate else [s.halt_reason or "no gate decision"],
        "pnl": oos.pnl if oos else None,
        "costs": oos.costs if oos else None,
        "sharpe": oos.sharpe if oos else None,
        "psr": psr if isinstance(psr, float) else None,
        "turnover": oos.turnover if oos else None,
    }


def _figure(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _model_to_trade(config: Config, s: TrainSummary) -> tuple[str, str]:
    """The sha256 the backtest and the paper daemon trade, and what it is (the rule is in the
    module docstring)."""
    if s.promoted and s.candidate_sha256:
        return s.candidate_sha256, f"the new candidate {s.candidate_sha256[:12]}, promoted"
    with open_database(config.storage, config.data_dir) as database:
        record = ModelRegistry(database).current_promoted(s.instrument_set)
    new = (
        f"the new candidate {s.candidate_sha256[:12]} was not promoted ({s.candidate_status})"
        if s.candidate_sha256
        else f"training produced no candidate ({s.halt_reason or 'see the report'})"
    )
    if record is not None:
        return record.sha256, f"the promoted incumbent {record.sha256[:12]} ({new})"
    if s.candidate_sha256:
        return s.candidate_sha256, (
            f"nothing is promoted for {s.instrument_set}: the unpromoted candidate "
            f"{s.candidate_sha256[:12]}, to show the last two steps (`tradeagent run` would not trade it)"
        )
    raise CommandError(f"{new} and nothing is promoted for {s.instrument_set}: nothing to trade")


def _paper(
    config: Config, out: Path, last_day: Path, *, checkpoint: str, profile: _Profile, console: Console
) -> dict[str, Any]:
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "agent.cli", "--log-format", "text"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRADEAGENT")}
    store = out / "state" / "nats"
    shutil.rmtree(store, ignore_errors=True)  # scratch: never an earlier run's stream
    try:
        server = NatsServer(store_dir=store)
        server.start()
    except NatsServerUnavailable as exc:
        raise CommandError(f"the paper step needs nats-server: {exc}") from None
    try:
        toml = write_atomic(out / "paper.toml", _paper_toml(config, server.url, checkpoint))
        client = ControlClient(control_endpoint(config.control, config.data_dir), timeout_s=2.0)
        daemon_log = logs / "daemon.log"
        with daemon_log.open("ab") as log:
            daemon = subprocess.Popen([*cli, "--config", str(toml), "run"], stdout=log, stderr=log, env=env)
        try:
            _wait_running(client, daemon, daemon_log, 120.0)
            relay_log = logs / "relay.log"
            with relay_log.open("ab") as log:
                relay = subprocess.Popen(
                    [
                        *cli,
                        "--config",
                        str(toml),
                        "relay",
                        "--source",
                        "replay",
                        "--path",
                        str(last_day),
                        "--pace",
                        f"{profile.pace:g}",
                    ],
                    stdout=log,
                    stderr=log,
                    env=env,
                )
            status = _wait_feed(client, relay, relay_log, 120.0)
            deadline = time.monotonic() + profile.paper_seconds
            with console.status("paper trading on the NATS feed") as spinner:
                while time.monotonic() < deadline and daemon.poll() is None:
                    time.sleep(1.0)
                    try:
                        status = client.request("status")
                    except ControlError:
                        continue
                    counts = status.get("counts", {})
                    left = deadline - time.monotonic()
                    spinner.update(
                        f"paper trading: {counts.get('decisions', 0)} decisions, "
                        f"{counts.get('orders', 0)} orders, {counts.get('fills', 0)} fills, "
                        f"realised P&L {status.get('realised_pnl', 0.0):,.2f} ({left:.0f} s left)"
                    )
            _stop(relay, 30.0)
        finally:
            code = _stop(daemon, 60.0)
    finally:
        server.close()
    if code != 0:
        raise CommandError(f"the paper daemon exited with {code}; see {daemon_log}")
    return {"status": status, "config": str(toml), "daemon_log": str(daemon_log), "relay_log": str(relay_log)}


def _profile(args: argparse.Namespace) -> _Profile:
    """``--quick`` or the full profile, with the options given on the command line."""
    changes = {
        k: v
        for k, v in (("days", args.days), ("paper_seconds", args.paper_seconds), ("pace", args.pace))
        if v is not None
    }
    profile = msgspec.structs.replace(_QUICK if args.quick else _FULL, **changes)
    if profile.days < 2:
        raise CommandError("--days must be at least 2 (one to train on, the last one held out)")
    if profile.paper_seconds <= 0 or profile.pace <= 0:
        raise CommandError("--paper-seconds and --pace must be > 0")
    return profile


def _synthesise(config: Config, out: Path, days: int, console: Console) -> tuple[Path, Path]:
    """Step 1: ``days`` days of synthetic data under ``out``; the directory holding all of them
    but the last (the training days, as links) and the last one (held out)."""
    synth = msgspec.structs.replace(config.synth, days=days)
    with RichProgress(console) as progress:
        progress.start("synthesise", days)
        files = write_synthetic(
            out / "data",
            instruments=config.feeds.instruments,
            synth=synth,
            seed=config.seed,
            on_day=lambda _day, _n: progress.advance("synthesise"),
        )
    files = sorted(files)
    train_dir = out / "train-days"
    train_dir.mkdir(parents=True, exist_ok=True)
    for old in train_dir.iterdir():
        old.unlink()
    for file in files[:-1]:
        (train_dir / file.name).symlink_to(file)
    return train_dir, files[-1]


def _run(args: argparse.Namespace) -> int:
    base = load_config(args.config)
    profile = _profile(args)
    out = output_dir("--out", Path(args.out).resolve())
    config = demo_config(base, out, profile)
    if args.device:
        config = msgspec.structs.replace(config, device=args.device)
    if args.seed is not None:
        config = msgspec.structs.replace(config, seed=args.seed)
    console = Console(stderr=True)
    started = time.monotonic()

    console.rule("1/4 synthesise a week of MBP-10 data with a planted signal")
    train_dir, held_out = _synthesise(config, out, profile.days, console)

    console.rule(f"2/4 walk-forward training on {profile.days - 1} days, then the promotion gates")
    reports = out / "reports"
    with RichProgress(console) as progress:
        trained = run_training(config, TrainRequest(data=train_dir, promote=True), progress)
    s = trained.summary
    train_report = write_report(trained, reports / "train.html")
    write_atomic(reports / "train.json", msgspec.json.encode(s).decode() + "\n")
    state = "promoted" if s.promoted else f"not promoted ({s.candidate_status or 'no candidate'})"
    gated = _gated(s)
    console.print(
        f"candidate {(s.candidate_sha256 or '-')[:12]}: {state}; the gate scored it as traded "
        f"(Thompson, Kelly x regime, risk limits, fills at arrival + latency, fees): "
        f"out-of-sample P&L {_figure(gated['pnl'], ',.2f')} after costs "
        f"{_figure(gated['costs'], ',.2f')}, Sharpe {_figure(gated['sharpe'], '.2f')}, "
        f"probabilistic Sharpe {_figure(gated['psr'], '.3f')}"
        + ("" if s.promoted else f"; why not: {'; '.join(gated['reasons'])}")
        + f"; report {train_report}"
    )
    traded, traded_model = _model_to_trade(config, s)
    console.print(f"model traded in steps 3 and 4: {traded_model}")

    console.rule(f"3/4 backtest of the held-out day {held_out.name} (vectorised driver)")
    with RichProgress(console) as progress:
        result = run_backtest(config, BacktestRequest(data=held_out, checkpoint=traded, fast=True), progress)
    bt_report, bt_summary = write_backtest(result, reports / "backtest")
    p = result.summary.performance
    console.print(
        f"held-out day: P&L after costs {p.pnl:,.2f} (costs {p.costs:,.2f}), {result.summary.fills} fills; "
        + ", ".join(f"{k} {v.pnl:,.2f}" for k, v in result.summary.baselines.items())
    )

    console.rule(f"4/4 paper daemon on the last day relayed through NATS ({profile.paper_seconds:g} s)")
    paper = _paper(config, out, held_out, checkpoint=traded, profile=profile, console=console)
    status = paper["status"]
    summary = {
        "out": str(out),
        "wall_s": round(time.monotonic() - started, 1),
        "promoted": s.promoted,
        "candidate_sha256": s.candidate_sha256,
        "traded_sha256": traded,
        "traded_model": traded_model,
        "gate": gated,
        "train_report": str(train_report),
        "backtest_report": str(bt_report),
        "backtest_summary": str(bt_summary),
        "backtest_pnl": p.pnl,
        "baselines_pnl": {k: v.pnl for k, v in result.summary.baselines.items()},
        "paper": {
            "model": status.get("model"),
            "counts": status.get("counts", {}),
            "positions": status.get("positions", {}),
            "realised_pnl": status.get("realised_pnl"),
            "unrealised_pnl": status.get("unrealised_pnl"),
        },
        "database": str(Path(config.data_dir) / "tradeagent.db"),
        "logs": [paper["daemon_log"], paper["relay_log"]],
        "paper_config": paper["config"],
        "symbols": config_symbols(config.feeds),
    }
    write_atomic(out / "demo-summary.json", json.dumps(summary, indent=1) + "\n")
    console.rule("done")
    print(
        f"demo finished in {summary['wall_s']:.0f} s\n"
        f"  training report:  {train_report}\n"
        f"  backtest report:  {bt_report}\n"
        f"  database:         {summary['database']}\n"
        f"  daemon log:       {paper['daemon_log']}\n"
        f"  relay log:        {paper['relay_log']}\n"
        f"  gate (as traded): {state}; out-of-sample P&L {_figure(gated['pnl'], ',.2f')}, "
        f"probabilistic Sharpe {_figure(gated['psr'], '.3f')}\n"
        f"  model traded:     {traded_model}\n"
        f"  paper daemon:     {status.get('counts', {}).get('fills', 0)} fills, positions "
        f"{status.get('positions', {})}, realised P&L {status.get('realised_pnl', 0.0)}\n"
        f"  summary:          {out / 'demo-summary.json'}"
    )
    return 0
