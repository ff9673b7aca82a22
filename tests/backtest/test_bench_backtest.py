"""``tradeagent bench backtest --json`` end to end on a small file: one JSON object with every
documented key; its figures are measurements, so only their sanity is checked (both drivers ran
and decided, the event driver on the requested prefix, the peak memory is the drivers')."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    env = dict(os.environ)
    env["TRADEAGENT_DATA_DIR"] = str(tmp_path / "data")
    env["TRADEAGENT__SYNTH__EVENTS_PER_SECOND"] = "2"
    for key, value in (("WINDOW", "4"), ("D_MODEL", "16"), ("N_LAYERS", "1"), ("HEADDIM", "8")):
        env[f"TRADEAGENT__MODEL__{key}"] = value
    run = subprocess.run(
        [
            *(sys.executable, "-m", "agent.cli", "bench", "backtest", "--json"),
            *("--records", "20000", "--event-records", "5000", "--chunks", "4"),
        ],
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    result = json.loads(run.stdout)  # exactly one JSON object: anything else fails to parse
    assert set(result) == KEYS
    assert result["records"] == 20000 and result["event_records"] == 5000
    assert result["bars"] > 0 and result["fast_decisions"] > 0 and result["event_decisions"] > 0
    assert result["event_records_per_s"] > 0 and result["fast_records_per_s"] > 0
    assert 0 < result["peak_rss_mb"] < 4096
