"""Where long work reports progress: the CLI draws rich bars on stderr
(:class:`agent.commands.progress.RichProgress`); library callers may pass :data:`SILENT`."""

from __future__ import annotations

from typing import Protocol

__all__ = ["SILENT", "Progress"]


class Progress(Protocol):
    """Named tasks with a known total, advanced as work is done."""

    def start(self, name: str, total: int) -> None: ...

    def advance(self, name: str, amount: int = 1) -> None: ...


class _Silent:
    def start(self, name: str, total: int) -> None:
        return None

    def advance(self, name: str, amount: int = 1) -> None:
        return None


SILENT: Progress = _Silent()
"""Progress that reports nothing."""
