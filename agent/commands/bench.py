"""``tradeagent bench <name>``: benchmarks that measure speed (never timed assertions in tests).

Each benchmark is a module ``agent.bench.<name>`` with a function ``run(args, config) -> dict``
(and optionally ``add_arguments(parser)``); this module only dispatches. With ``--json`` one
JSON object goes to stdout (progress and logs go to stderr); otherwise a table is printed.
The keys of each benchmark and its figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from agent.config import load_config

__all__ = ["BENCHMARKS", "register"]

# name -> one-line help; the code is agent.bench.<name>.run
BENCHMARKS: dict[str, str] = {
    "backtest": "records/s of the event-driven and vectorised backtest drivers, peak memory",
    "daemon": "end-to-end daemon latency (bar-closing record -> order) at 10k records/s via NATS",
    "db": "durable fills/s and promotion transactions/s on SQLite and PostgreSQL",
    "feed": "market-data records/s: vectorised and incremental features, NATS relay end to end",
    "infer": "decision latency/throughput of the inference engine and training-step throughput",
    "train": "trainer speed: environment steps/s, learner updates/s, standard 20-day 4-fold retrain",
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print its figures")
    names = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, help_text in BENCHMARKS.items():
        p = names.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        module = importlib.import_module(f"agent.bench.{name}")
        if hasattr(module, "add_arguments"):
            module.add_arguments(p)
        p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    module = importlib.import_module(f"agent.bench.{args.bench}")
    result: dict[str, Any] = module.run(args, config)
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        width = max(len(k) for k in result)
        for key, value in result.items():
            shown = f"{value:,.1f}" if isinstance(value, float) else str(value)
            print(f"{key:<{width}}  {shown}")
    return 0
