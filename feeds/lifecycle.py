"""The lifecycle of every long-lived part (STYLE item 6): the market-data sources
(:class:`feeds.sources.Source`) and the daemon's parts (:class:`agent.daemon.lifecycle.Component`)::

    NEW --start--> STARTING --ok--> RUNNING --stop--> STOPPING --> STOPPED
                       |               |
                       +----error----> FAULTED --stop--> STOPPING --> STOPPED

``start`` and ``stop`` drive the table; subclasses implement ``_start`` and ``_stop`` and,
where they need them, the hooks :meth:`Lifecycle._start_failed` (what a failed start does
besides FAULTED, and the error it raises: a source releases at once and names the failure),
:meth:`Lifecycle._started` and :meth:`Lifecycle._stopped`. ``stop`` is idempotent and safe from
any state: a part that failed to start (FAULTED) is stopped like a running one, so ``_stop``
releases whatever ``_start`` acquired before it failed.
"""

from __future__ import annotations

import abc
import enum
import logging

__all__ = ["Lifecycle", "State"]

log = logging.getLogger(__name__)


class State(enum.StrEnum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAULTED = "faulted"


class Lifecycle(abc.ABC):
    """An explicit state and public :meth:`start`/:meth:`stop` around private hooks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._state = State.NEW

    @property
    def state(self) -> State:
        return self._state

    async def start(self) -> None:
        """``_start``; on failure the part is FAULTED and the error that :meth:`_start_failed`
        returns propagates."""
        if self._state is not State.NEW:
            raise self._usage_error(f"{self.name}: cannot start in state {self._state}")
        self._state = State.STARTING
        try:
            await self._start()
        except BaseException as exc:
            self._state = State.FAULTED
            error = await self._start_failed(exc)
            if error is exc:
                raise
            raise error from exc
        self._state = State.RUNNING
        self._started()

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
            self._stopped()

    def _fault(self) -> None:
        """The work of a running part failed: FAULTED until stopped."""
        if self._state is State.RUNNING:
            self._state = State.FAULTED

    @abc.abstractmethod
    def _usage_error(self, message: str) -> Exception:
        """The error for a call the state does not allow (the package's own error type)."""

    async def _start_failed(self, exc: BaseException) -> BaseException:
        """After a failed ``_start`` (state FAULTED): the error to raise, ``exc`` itself or a
        clearer one (raised from ``exc``)."""
        return exc

    def _started(self) -> None:
        """After a successful start."""
        log.debug("%s: started", self.name)

    def _stopped(self) -> None:
        """After ``_stop`` (also when it raised)."""
        log.debug("%s: stopped", self.name)

    @abc.abstractmethod
    async def _start(self) -> None: ...

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Release everything; also called after a failed ``_start``, so it must tolerate a
        start that went part of the way."""
