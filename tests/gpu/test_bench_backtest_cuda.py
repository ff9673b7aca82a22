"""``tradeagent bench backtest --json`` on the CUDA engine, small file and model: both drivers'
engine calls carry the device's own time, which is part of the call's wall time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench import TINY_MODEL, bench_json

pytestmark = pytest.mark.gpu


def test_bench_backtest_reports_the_device_time_of_the_engine_calls(tmp_path: Path) -> None:
    env = {**TINY_MODEL, "TRADEAGENT__SYNTH__EVENTS_PER_SECOND": "2", "TRADEAGENT__DEVICE": "cuda"}
    result = bench_json(
        "backtest",
        *("--records", "20000", "--event-records", "5000", "--chunks", "4"),
        data_dir=tmp_path / "data",
        env=env,
    )
    for driver in ("event", "fast"):
        device, wall = result[f"{driver}_device_us"], result[f"{driver}_decide_us"]
        assert device is not None and 0 < device < wall, (driver, device, wall)
