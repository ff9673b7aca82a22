"""The lifecycle of the daemon and of each of its long-lived parts (STYLE item 6).

Every part with a task of its own (:class:`~agent.daemon.session.Session`,
:class:`~agent.daemon.intake.Intake`, :class:`~agent.daemon.decisions.Decisions`,
:class:`~agent.daemon.writes.LedgerWrites`, :class:`~agent.daemon.supervision.Supervisor`) and
the :class:`~agent.daemon.app.Daemon` itself is a :class:`Component`, with the states of
:class:`feeds.sources.Source`::

    NEW --start--> STARTING --ok--> RUNNING --stop--> STOPPING --> STOPPED
                       |               |
                       +----error----> FAULTED --stop--> STOPPING --> STOPPED
                                   (a part whose task failed)

``start`` and ``stop`` drive the table; subclasses implement ``_start`` and ``_stop``. ``stop``
is idempotent and safe from any state: a part that failed to start (FAULTED) is stopped like a
running one, so ``_stop`` releases whatever ``_start`` acquired before it failed. The daemon
registers each part's ``stop`` before it starts the part, on one stack unwound in reverse
order at the end (STYLE item 14).
"""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Coroutine
from typing import Any

from agent.errors import AgentError

__all__ = ["Component", "State"]


class State(enum.StrEnum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAULTED = "faulted"


class Component(abc.ABC):
    """A long-lived part: an explicit state, public :meth:`start`/:meth:`stop`, private hooks,
    and the tasks it runs (cancelled and awaited by :meth:`_cancel_tasks`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._state = State.NEW
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def state(self) -> State:
        return self._state

    async def start(self) -> None:
        """``_start``; on failure the part is FAULTED and the error propagates."""
        if self._state is not State.NEW:
            raise AgentError(f"{self.name}: cannot start in state {self._state}")
        self._state = State.STARTING
        try:
            await self._start()
        except BaseException:
            self._state = State.FAULTED
            raise
        self._state = State.RUNNING

    async def stop(self) -> None:
        """``_stop`` once, from any state but NEW (nothing to release) and STOPPING/STOPPED."""
        if self._state in (State.STOPPING, State.STOPPED):
            return
        if self._state is State.NEW:
            self._state = State.STOPPED
            return
        self._state = State.STOPPING
        try:
            await self._stop()
        finally:
            self._state = State.STOPPED

    def _fault(self) -> None:
        """A task of a running part failed: FAULTED until stopped."""
        if self._state is State.RUNNING:
            self._state = State.FAULTED

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

    @abc.abstractmethod
    async def _start(self) -> None: ...

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Release everything; also called after a failed ``_start``."""
