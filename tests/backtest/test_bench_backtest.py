"""``tradeagent bench backtest --json`` end to end on a small file: one JSON object with every
documented key; its figures are measurements, so only their sanity is checked (both drivers ran
and decided, the event driver on the requested prefix, the time breakdowns add up, no device
time on the CPU engine, the peak memory is the drivers')."""

from __future__ import annotations

from pathlib import Path

from tests.support.bench import small_bench_backtest

KEYS = {
    "records",
    "bars",
    "event_records",
    "event_records_per_s",
    "event_decisions",
    "fast_records_per_s",
    "fast_decisions",
    "peak_rss_mb",
    "event_decide_us",
    "event_device_us",
    "event_host_us",
    "fast_load_s",
    "fast_steps_s",
    "fast_engine_s",
    "fast_rows_per_call",
    "fast_decide_us",
    "fast_device_us",
}


def test_bench_backtest_prints_one_json_object_with_its_keys(tmp_path: Path) -> None:
    result = small_bench_backtest(tmp_path / "data", "cpu")
    assert set(result) == KEYS
    assert result["records"] == 20000 and result["event_records"] == 5000
    assert result["bars"] > 0 and result["fast_decisions"] > 0 and result["event_decisions"] > 0
    assert result["event_records_per_s"] > 0 and result["fast_records_per_s"] > 0
    assert 0 < result["peak_rss_mb"] < 4096
    # one engine call a bar close for the event driver; every span's row a step for the other
    assert result["event_decide_us"] > 0 and result["event_host_us"] > 0
    assert 1 < result["fast_rows_per_call"] <= 4 * 2  # --chunks 4 over the two instruments
    assert result["fast_load_s"] > 0 and result["fast_steps_s"] > 0 and result["fast_engine_s"] > 0
    fast_s = result["fast_load_s"] + result["fast_steps_s"] + result["fast_engine_s"]
    assert abs(20000 / fast_s - result["fast_records_per_s"]) < 0.05 * result["fast_records_per_s"]
    assert result["event_device_us"] is None and result["fast_device_us"] is None  # the CPU engine
