"""What the long-running feed commands (``tradeagent relay``, ``tradeagent record``) share: the
job runs until it ends or until SIGTERM or SIGINT, with a counter display on stderr, and its
final counters (and its source's) are printed as one JSON object on stdout or a line on stderr.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from feeds.sources import Source

__all__ = ["FeedJob", "report", "run_feed_job"]


class _Counters(Protocol):
    def snapshot(self) -> dict[str, int]: ...


C = TypeVar("C", bound=_Counters)
C_co = TypeVar("C_co", bound=_Counters, covariant=True)


class FeedJob(Protocol[C_co]):
    """A :class:`feeds.relay.Relay` or a :class:`feeds.recorder.Recorder`."""

    @property
    def source(self) -> Source: ...

    async def run(
        self, stop: asyncio.Event | None = None, progress: Callable[[C_co], None] | None = None
    ) -> C_co: ...


def run_feed_job(job: FeedJob[C], label: str, status: Callable[[C], str]) -> dict[str, Any]:
    """Run ``job`` until it ends or a signal stops it, showing ``label`` and ``status(counters)``
    on stderr: its counters, with its source's under ``source``."""

    async def main(stop: asyncio.Event) -> dict[str, Any]:
        with _display() as progress:
            task = progress.add_task(label, status="")
            counters = await job.run(stop, lambda c: progress.update(task, status=status(c)))
        return {**counters.snapshot(), "source": job.source.counters.snapshot()}

    return _until_signalled(main)


def report(result: dict[str, Any], *, as_json: bool, line: str) -> None:
    """The final counters as one JSON object on stdout (``--json``), else ``line`` on stderr."""
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print(line, file=sys.stderr)


def _until_signalled(main: Callable[[asyncio.Event], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Run ``main(stop)`` on a new event loop; SIGTERM or SIGINT sets ``stop`` (a clean end:
    flush, acknowledge, exit 0), a second one cancels ``main`` (KeyboardInterrupt-like exit)."""

    async def runner() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal() -> None:
            if stop.is_set():  # a second signal: stop waiting for a clean end
                task.cancel()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        try:
            return await main(stop)
        except asyncio.CancelledError:
            if stop.is_set():
                raise KeyboardInterrupt from None  # the CLI reports "interrupted", exit 130
            raise
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    return asyncio.run(runner())


def _display() -> Progress:
    """A counter-style progress display on stderr (the total is unknown)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
