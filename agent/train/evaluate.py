"""The gate's as-traded evaluations, run beside the training.

Each fold's model (and the incumbent) is scored by ``tradeagent backtest``'s event-driven
result on the fold's test block (:func:`agent.backtest.api.run_backtest`, by its exact route),
and the baselines are traded on the same block (:func:`agent.backtest.api.run_baselines`, the
same books as that backtest's). Those jobs are independent of each other and of the folds still
training, so :class:`AsTradedRunner` runs them in worker processes while the trainer goes on;
the results are the same, to the cent, as the same jobs run one after another (each is
deterministic and starts from nothing but the checkpoint, its floors and the window).

With one worker (``train.eval_workers = 1``, or ``0`` on a host with fewer than four cores) the
jobs run in this process when submitted. Workers are spawned (never forked: the
parent may hold a CUDA context) and each builds its own inference engine on the configured
device.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.pool import AsyncResult
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from agent.backtest.api import BacktestRequest, BacktestResult, Books, run_backtest, run_baselines
from agent.backtest.inputs import ResolvedCheckpoint
from agent.config import Config
from agent.model.checkpoint import Checkpoint
from agent.progress import SILENT

__all__ = ["AsTradedRunner", "Pending", "eval_workers"]


def eval_workers(configured: int, jobs: int) -> int:
    """Worker processes for ``jobs`` evaluations: ``configured`` when set, else (0) one per job up
    to the host's cores less two (the trainer's and the system's), 1 below four cores."""
    if configured > 0:
        return min(configured, max(1, jobs))
    cores = os.cpu_count() or 1
    return 1 if cores < 4 else max(1, min(jobs, cores - 2))


def _as_traded(
    config: Config, data: Path, checkpoint: Checkpoint, floors: dict[int, float], window: tuple[int, int]
) -> BacktestResult:
    """One evaluation (a worker's job; the verified checkpoint travels pickled)."""
    request = BacktestRequest(
        data=data,
        checkpoint=ResolvedCheckpoint(checkpoint, floors),
        start_ns=window[0],
        end_ns=window[1],
        baselines=False,
        exact=True,
    )
    return run_backtest(config, request, SILENT)


def _baselines(config: Config, data: Path, window: tuple[int, int]) -> dict[str, Books]:
    """The baselines on one test block (a worker's job)."""
    return run_baselines(config, data, window[0], window[1])


T_co = TypeVar("T_co", covariant=True)
V = TypeVar("V")


class Pending(Protocol[T_co]):
    """A job that may still be running: ``result()`` waits for it (and raises what it raised)."""

    def result(self) -> T_co: ...


class _Done(Generic[V]):
    """A job run in this process."""

    def __init__(self, value: V | None, error: BaseException | None) -> None:
        self._value, self._error = value, error

    def result(self) -> V:
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


class _Async(Generic[V]):
    """A job in a worker process."""

    def __init__(self, handle: AsyncResult[V]) -> None:
        self._handle = handle

    def result(self) -> V:
        return self._handle.get()


class AsTradedRunner:
    """Submits as-traded evaluations. Leaving the ``with`` block waits for the workers when all
    went well; after an error (a time limit, an interrupt) it terminates them at once."""

    def __init__(self, config: Config, data: Path, *, workers: int) -> None:
        self.config, self.data = config, data
        self.workers = workers
        self._pool = multiprocessing.get_context("spawn").Pool(workers) if workers > 1 else None

    def submit(
        self, checkpoint: Checkpoint, floors: dict[int, float], window: tuple[int, int]
    ) -> Pending[BacktestResult]:
        """The evaluation of ``checkpoint`` traded with ``floors`` on ``window`` ([start, end) ns),
        without the baselines (:meth:`submit_baselines`)."""
        return self._submit(_as_traded, (self.config, self.data, checkpoint, floors, window))

    def submit_baselines(self, window: tuple[int, int]) -> Pending[dict[str, Books]]:
        """The baselines' books on ``window``."""
        return self._submit(_baselines, (self.config, self.data, window))

    def _submit(self, job: Callable[..., V], args: tuple[Any, ...]) -> Pending[V]:
        """``job(*args)`` in a worker, or here at once (its error raised by ``result()``, as a
        worker's would be)."""
        if self._pool is not None:
            return _Async(self._pool.apply_async(job, args))
        try:
            return _Done(job(*args), None)
        except Exception as exc:
            return _Done(None, exc)

    def close(self, *, terminate: bool = False) -> None:
        if self._pool is not None:
            if terminate:
                self._pool.terminate()
            else:
                self._pool.close()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> AsTradedRunner:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(terminate=kind is not None)
