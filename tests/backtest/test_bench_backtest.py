"""``tradeagent bench backtest --json`` end to end on a small file: one JSON object with every
documented key; its figures are measurements, so only their sanity is checked (both drivers ran
and decided, the event driver on the requested prefix, the peak memory is the drivers')."""

from __future__ import annotations

from pathlib import Path

from tests.support.bench import TINY_MODEL, bench_json

KEYS = {
    "records",
    "bars",
    "event_records",
    "event_records_per_s",
    "event_decisions",
    "fast_records_per_s",
    "fast_decisions",
    "peak_rss_mb",
}


def test_bench_backtest_prints_one_json_object_with_its_keys(tmp_path: Path) -> None:
    env = {**TINY_MODEL, "TRADEAGENT__SYNTH__EVENTS_PER_SECOND": "2"}
    result = bench_json(
        "backtest",
        *("--records", "20000", "--event-records", "5000", "--chunks", "4"),
        data_dir=tmp_path / "data",
        env=env,
    )
    assert set(result) == KEYS
    assert result["records"] == 20000 and result["event_records"] == 5000
    assert result["bars"] > 0 and result["fast_decisions"] > 0 and result["event_decisions"] > 0
    assert result["event_records_per_s"] > 0 and result["fast_records_per_s"] > 0
    assert 0 < result["peak_rss_mb"] < 4096
