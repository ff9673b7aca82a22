"""Waiting in tests: for a condition, with a deadline, never for a fixed time.

:func:`wait_until` polls a predicate until it gives something true (and returns that) or the
deadline passes (then it fails naming what it waited for); :func:`wait_until_async` is the same
on the test's event loop, which keeps running between polls. Where there is a real event to wait
on (a line of output, a socket, a file, an ``asyncio.Event``), wait on that instead.

The one wait on time itself is :func:`observed`: an observation window, for what must not happen
(nothing to wait for: the time passing is what the test is about).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TypeAlias, TypeVar

__all__ = ["observed", "wait_until", "wait_until_async"]

T = TypeVar("T")

What: TypeAlias = str | Callable[[], str]
"""What is waited for, in words; a callable is asked at the deadline (to tell the last state)."""


def wait_until(predicate: Callable[[], T | None], timeout: float, what: What, *, interval: float = 0.05) -> T:
    """``predicate()`` once it is true, polled every ``interval`` seconds; an
    :class:`AssertionError` naming ``what`` when ``timeout`` seconds pass first."""
    for _ in _polls(timeout):
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise _timed_out(timeout, what)


async def wait_until_async(
    predicate: Callable[[], T | None], timeout: float, what: What, *, interval: float = 0.02
) -> T:
    """:func:`wait_until` on the running event loop (it runs between the polls)."""
    for _ in _polls(timeout):
        result = predicate()
        if result:
            return result
        await asyncio.sleep(interval)
    raise _timed_out(timeout, what)


async def observed(read: Callable[[], T], seconds: float, *, interval: float = 0.02) -> list[T]:
    """What ``read()`` gives over the next ``seconds`` (an observation window), polled every
    ``interval`` seconds on the running event loop."""
    values = [read()]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(interval)
        values.append(read())
    return values


def _polls(timeout: float) -> Iterator[None]:
    """One poll now, then one after each wait while ``timeout`` seconds have not passed."""
    deadline = time.monotonic() + timeout
    yield
    while time.monotonic() < deadline:
        yield


def _timed_out(timeout: float, what: What) -> AssertionError:
    return AssertionError(f"not within {timeout:g} s: {what() if callable(what) else what}")
