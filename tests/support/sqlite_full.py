"""A full disk for SQLite without root: ``PRAGMA max_page_count``.

SQLite answers ``SQLITE_FULL`` ("database or disk is full") when a write would grow the
database past ``max_page_count`` pages, exactly as it does on a full filesystem (a tmpfs mount
would need root, which CI may not give). The limit belongs to each connection, so
:func:`installed` sets it on every checkout from every SQLAlchemy pool of this process, read
from a small file that the test rewrites: :meth:`PageLimit.fill` (the database cannot grow past
its current size) and :meth:`PageLimit.free` (space is back).

``python -m tests.support.sqlite_full ARGS...`` runs ``tradeagent ARGS...`` with the limit read
from the file named by ``TRADEAGENT_TEST_PAGE_LIMIT_FILE``: a real daemon process whose disk
the test fills and frees.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import Pool

from agent.cli import main as tradeagent

__all__ = ["ENV", "PageLimit", "installed"]

ENV = "TRADEAGENT_TEST_PAGE_LIMIT_FILE"
UNLIMITED = 1_073_741_823
"""SQLite's default ``max_page_count``."""


class PageLimit:
    """The page limit in ``file`` (absent: unlimited)."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def pages(self) -> int:
        try:
            return int(self.file.read_text())
        except FileNotFoundError:
            return UNLIMITED

    def fill(self, database: Path) -> int:
        """From the next transaction on, ``database`` cannot grow: it is compacted (``VACUUM``:
        no free page and no slack left in its b-trees, so a write soon needs a new page) and the
        limit is its size then (in pages, returned)."""
        with contextlib.closing(sqlite3.connect(database, timeout=30.0)) as connection:
            connection.execute("VACUUM")
            pages = int(connection.execute("PRAGMA page_count").fetchone()[0])
        temporary = self.file.with_name(self.file.name + ".tmp")
        temporary.write_text(str(pages))
        temporary.replace(self.file)  # a reader sees the old number or the new one
        return pages

    def free(self) -> None:
        """Space is back: no limit from the next transaction on."""
        self.file.unlink(missing_ok=True)


@contextlib.contextmanager
def installed(limit: PageLimit) -> Iterator[None]:
    """While inside: every SQLite connection checked out of a pool gets ``limit``'s pages."""

    def checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute(f"PRAGMA max_page_count = {limit.pages()}")

    event.listen(Pool, "checkout", checkout)
    try:
        yield
    finally:
        event.remove(Pool, "checkout", checkout)


def main() -> int:
    with installed(PageLimit(Path(os.environ[ENV]))):
        return tradeagent(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
