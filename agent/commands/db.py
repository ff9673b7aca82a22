"""``tradeagent db upgrade|current|history``: schema migrations of the configured database.

The database is the one the process would use: ``--config`` file, ``TRADEAGENT_DB_URL`` or
the embedded SQLite file under the data directory. Passwords never appear in the output.
Errors (malformed URL, unreachable server, corrupt file) exit with code 2.
"""

from __future__ import annotations

import argparse

from agent.config import load_config
from storage.database import Database
from storage.schema import current_revision, head_revision, history, open_database, upgrade

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("db", help="database schema migrations (upgrade, current, history)")
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    up = actions.add_parser("upgrade", help="upgrade the schema to the version this code needs (head)")
    up.set_defaults(func=_upgrade)
    cur = actions.add_parser("current", help="show the schema revision of the database and the head")
    cur.set_defaults(func=_current)
    hist = actions.add_parser("history", help="list the shipped migrations, newest first")
    hist.set_defaults(func=_history)


def _open(args: argparse.Namespace) -> Database:
    config = load_config(args.config)
    return open_database(config.storage, config.data_dir, check_schema=False)


def _upgrade(args: argparse.Namespace) -> int:
    with _open(args) as database:
        before, after = upgrade(database)
        if before == after:
            print(f"{database.display_url}: already at head {after}")
        else:
            print(f"{database.display_url}: upgraded from {before or '<empty>'} to {after}")
    return 0


def _current(args: argparse.Namespace) -> int:
    with _open(args) as database:
        current = current_revision(database)
        head = head_revision()
        if current == head:
            state = "at head"
        elif current is not None and current not in {r.revision for r in history()}:
            state = "unknown to this version of tradeagent: upgrade tradeagent"
        else:
            state = "behind head: run `tradeagent db upgrade`"
        print(f"{database.display_url}: revision {current or '<empty>'} (head {head}, {state})")
    return 0


def _history(args: argparse.Namespace) -> int:
    for revision in history():
        mark = " (head)" if revision.is_head else ""
        print(f"{revision.down_revision or '<base>'} -> {revision.revision}{mark}: {revision.message}")
    return 0
