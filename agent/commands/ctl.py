"""``tradeagent ctl COMMAND``: talk to a running daemon over its control socket.

Commands: ``status``, ``halt [--reason TEXT]``, ``resume``, ``flatten``, ``reload``,
``promote SHA256``, ``rollback``. The endpoint and keys come from the ``[control]`` section of
the same configuration the daemon runs with (``--config``). ``promote`` takes the full sha256 or
a unique prefix of at least 8 hex digits, resolved against the checkpoint store of the
configuration's ``data_dir`` exactly as ``backtest --checkpoint`` resolves one (an unknown or
ambiguous prefix is refused before the daemon is asked). Exit code 0 on success, 2 when the
daemon is unreachable or refuses the command.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from agent.backtest.inputs import match_sha256
from agent.config import load_config
from agent.control.client import ControlClient
from agent.control.endpoints import control_endpoint, load_client_keys
from agent.control.messages import COMMANDS, Command
from agent.errors import CommandError
from storage import CheckpointStore

__all__ = ["register"]

_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("ctl", help="control a running daemon (status, halt, resume, flatten, ...)")
    parser.add_argument("action", choices=COMMANDS, help="what to ask the daemon")
    parser.add_argument(
        "sha256", nargs="?", default="", help="promote: the checkpoint (its sha256, or 8+ hex digits of it)"
    )
    parser.add_argument("--reason", default="operator", help="halt: why (stored with the halt event)")
    parser.add_argument("--endpoint", help="override the control endpoint of the configuration")
    parser.add_argument("--json", action="store_true", help="print the reply as one JSON object")
    parser.set_defaults(func=_run)


def _full_sha256(text: str, data_dir: str) -> str:
    """A full sha256 as given (the daemon verifies it in its own store); a prefix resolved in the
    local store."""
    if _SHA256.match(text):
        return text.lower()
    return match_sha256(text, CheckpointStore.for_data_dir(data_dir), "promote")


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
            raise CommandError("promote needs the checkpoint's sha256 (or a unique prefix of 8+ hex digits)")
        params["sha256"] = _full_sha256(args.sha256, config.data_dir)
    result = client.request(command, **params)
    if args.json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        width = max((len(k) for k in result), default=0)
        for key, value in result.items():
            shown = json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)
            print(f"{key:<{width}}  {shown}")
    return 0
