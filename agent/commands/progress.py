"""Progress bars of the long-running commands: rich bars on stderr, one per named phase.

:class:`RichProgress` satisfies the runners' ``Progress`` protocol (``start(name, total)``,
``advance(name, amount)``) of :mod:`agent.train.walkforward` and :mod:`agent.backtest.api`.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["RichProgress"]


class RichProgress:
    """Rich progress bars on stderr, one per named phase (the runners' ``Progress`` protocol)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def start(self, name: str, total: int) -> None:
        self._tasks[name] = self._progress.add_task(name, total=total)

    def advance(self, name: str, amount: int = 1) -> None:
        self._progress.advance(self._tasks[name], amount)
