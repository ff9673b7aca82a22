"""The engine's decisions timed from outside a benchmark's run: ``InferenceEngine.decide``, a
public call, wrapped for the run (``bench daemon`` and ``bench backtest``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from agent.gpu.engine import InferenceEngine

__all__ = ["EngineCalls"]


class EngineCalls:
    """Every ``InferenceEngine.decide`` call of the run while :meth:`installed`: its wall time and
    rows, and, on every ``device_every``-th call, the engine's device time of it
    (``InferenceEngine.device_us``: a CUDA engine's own timer; reading it costs a few
    microseconds, which a driver's rate would otherwise carry on every decision)."""

    def __init__(self, device_every: int = 1) -> None:
        self.device_every = device_every
        self.wall_ns: list[int] = []
        self.rows = 0
        self.device_us: list[float] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        decide = InferenceEngine.decide

        def timed(engine: InferenceEngine, slots: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                decided = decide(engine, slots, *args, **kwargs)
            finally:
                self.wall_ns.append(time.perf_counter_ns() - started)
            self.rows += int(np.size(slots))
            if len(self.wall_ns) % self.device_every == 0 and (device := engine.device_us()) is not None:
                self.device_us.append(device)
            return decided

        InferenceEngine.decide = timed  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            InferenceEngine.decide = decide  # type: ignore[method-assign]

    def wall_s(self) -> float:
        """Every call's wall time, summed (seconds)."""
        return sum(self.wall_ns) / 1e9

    def rows_per_call(self) -> float:
        return self.rows / max(len(self.wall_ns), 1)

    def median_wall_us(self) -> float | None:
        """The median call's wall time (us), ``None`` without a call."""
        return _median(np.asarray(self.wall_ns) / 1e3)

    def median_device_us(self) -> float | None:
        """The median device time read (us), ``None`` without a device timer."""
        return _median(np.asarray(self.device_us))


def _median(values: np.ndarray[Any, Any]) -> float | None:
    return round(float(np.median(values)), 2) if values.size else None
