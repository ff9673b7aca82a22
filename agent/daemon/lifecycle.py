"""The lifecycle of the daemon and of each of its long-lived parts (STYLE item 6).

Every part with a task of its own (:class:`~agent.daemon.session.Session`,
:class:`~agent.daemon.intake.Intake`, :class:`~agent.daemon.decisions.Decisions`,
:class:`~agent.daemon.writes.LedgerWrites`, :class:`~agent.daemon.supervision.Supervisor`) and
the :class:`~agent.daemon.app.Daemon` itself is a :class:`Component`: the lifecycle of
:mod:`feeds.lifecycle` (the one the market-data sources have), where a running part also turns
FAULTED when one of its tasks fails. A part that failed to start is stopped like a running
one, so ``_stop`` releases whatever ``_start`` acquired before it failed. The daemon
registers each part's ``stop`` before it starts the part, on one stack unwound in reverse
order at the end (STYLE item 14).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from agent.errors import AgentError
from feeds.lifecycle import Lifecycle, State

__all__ = ["Component", "State"]


class Component(Lifecycle):
    """A long-lived part: the shared lifecycle, plus the tasks it runs (cancelled and awaited by
    :meth:`_cancel_tasks`)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._tasks: list[asyncio.Task[None]] = []

    def _usage_error(self, message: str) -> Exception:
        return AgentError(message)

    def _task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.append(task)
        return task

    async def _cancel_tasks(self) -> None:
        """Cancel this part's tasks and wait for them (their errors were logged where raised)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
