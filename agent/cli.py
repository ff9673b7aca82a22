"""The ``tradeagent`` command line.

Each sub-command lives in its own module under :mod:`agent.commands` and exposes
``register(subparsers)``; this module only wires them together, sets up logging and turns
the project's known errors into a clear message and a non-zero exit code.

A reader that goes away (``tradeagent ctl status | head -1``) ends any command quietly: no
traceback, exit code 141 (128 + SIGPIPE, what a shell reports for a process that SIGPIPE ended).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence

from agent import __version__
from agent.config import ConfigError
from agent.errors import AgentError
from agent.logs import setup_logging
from feeds.errors import FeedError
from storage.errors import StorageError

__all__ = ["main"]

# Sub-command modules, in the order `tradeagent --help` lists them.
COMMANDS: tuple[str, ...] = (
    "demo",
    "synth",
    "backtest",
    "bench",
    "db",
    "relay",
    "record",
    "train",
    "run",
    "ctl",
    "gateway",
)

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE

log = logging.getLogger("tradeagent")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tradeagent",
        description="Live trading agent for Databento MBP-10 feeds with an embedded GPU trainer.",
    )
    parser.add_argument("--config", metavar="PATH", help="TOML configuration file (default: embedded)")
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        default="auto",
        help="log format on stderr (auto: JSON under systemd, text otherwise)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"agent.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:
        if not _stdout_gone():
            raise
        # The interpreter flushes stdout again on exit: point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _stdout_gone() -> bool:
    """True when stdout is a pipe or socket whose reader has closed it (another broken pipe,
    e.g. a subprocess's, is a real error)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by a non-file (io.UnsupportedOperation)
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR (pipe) and POLLHUP (socket) are always reported
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format, logging.DEBUG if args.verbose else logging.INFO)
    try:
        code: int = args.func(args)
    except (ConfigError, AgentError, FeedError, StorageError) as exc:
        print(f"tradeagent {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tradeagent {args.command}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
