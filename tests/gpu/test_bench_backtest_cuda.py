"""``tradeagent bench backtest --json`` on the CUDA engine, small file and model: both drivers'
engine calls carry the device's own time, which is part of the call's wall time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench import small_bench_backtest

pytestmark = pytest.mark.gpu


def test_bench_backtest_reports_the_device_time_of_the_engine_calls(tmp_path: Path) -> None:
    result = small_bench_backtest(tmp_path / "data", "cuda")
    for driver in ("event", "fast"):
        device, wall = result[f"{driver}_device_us"], result[f"{driver}_decide_us"]
        assert device is not None and 0 < device < wall, (driver, device, wall)
