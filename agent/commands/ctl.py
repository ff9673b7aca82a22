"""``tradeagent ctl COMMAND``: talk to a running daemon over its control socket.

Commands: ``status``, ``halt [--reason TEXT]``, ``resume``, ``flatten``, ``reload``,
``promote SHA256``, ``rollback``. The endpoint and keys come from the ``[control]`` section of
the same configuration the daemon runs with (``--config``). Exit code 0 on success, 2 when the
daemon is unreachable or refuses the command.
"""

from __future__ import annotations

import argparse
import json
import sys

from agent.config import load_config
from agent.control.client import ControlClient
from agent.control.endpoints import control_endpoint, load_client_keys
from agent.control.messages import COMMANDS, Command

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("ctl", help="control a running daemon (status, halt, resume, flatten, ...)")
    parser.add_argument("action", choices=COMMANDS, help="what to ask the daemon")
    parser.add_argument("sha256", nargs="?", default="", help="promote: the checkpoint to trade")
    parser.add_argument("--reason", default="operator", help="halt: why (stored with the halt event)")
    parser.add_argument("--endpoint", help="override the control endpoint of the configuration")
    parser.add_argument("--json", action="store_true", help="print the reply as one JSON object")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    endpoint = args.endpoint or control_endpoint(config.control, config.data_dir)
    client = ControlClient(endpoint, config.control.request_timeout_s, load_client_keys(config.control))
    command: Command = args.action
    params: dict[str, str] = {}
    if command == "halt":
        params["reason"] = args.reason
    if command == "promote":
        if not args.sha256:
            print("tradeagent ctl: promote needs the checkpoint's sha256", file=sys.stderr)
            return 2
        params["sha256"] = args.sha256
    result = client.request(command, **params)
    if args.json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        width = max((len(k) for k in result), default=0)
        for key, value in result.items():
            shown = json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)
            print(f"{key:<{width}}  {shown}")
    return 0
