"""``tradeagent run``: the trading daemon (paper or live), usually under systemd.

Runs until SIGTERM/SIGINT, then stops in order (intake off, resting orders cancelled, state
persisted) and exits 0. ``--data-dir`` overrides ``data_dir`` (database, checkpoints, sockets).
"""

from __future__ import annotations

import argparse

import msgspec

from agent.config import load_config
from agent.daemon.app import run_daemon

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("run", help="run the trading daemon (paper or live) until SIGTERM")
    parser.add_argument("--data-dir", help="override data_dir (database, checkpoints, control sockets)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.data_dir:
        config = msgspec.structs.replace(config, data_dir=args.data_dir)
    return run_daemon(config, config_path=args.config)
