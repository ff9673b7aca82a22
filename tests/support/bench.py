"""Run ``tradeagent bench NAME --json`` as a real subprocess and return its one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TINY_MODEL = {
    f"TRADEAGENT__MODEL__{key}": value
    for key, value in {"WINDOW": "4", "D_MODEL": "16", "N_LAYERS": "1", "HEADDIM": "8"}.items()
}
"""Environment that makes the configured model a tiny one (a benchmark's figures are only checked
for sanity)."""


def bench_json(name: str, *args: str, data_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """The benchmark's JSON (exactly one object on stdout: anything else fails to parse), run with
    ``data_dir`` as the data directory and ``env`` added to this process's environment."""
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "bench", name, "--json", *args],
        env={**os.environ, "TRADEAGENT_DATA_DIR": str(data_dir), **env},
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def small_bench_backtest(data_dir: Path, device: str) -> dict[str, Any]:
    """``bench backtest`` on a small file (20,000 records, the event driver on the first 5,000,
    four spans an instrument) with the tiny model on ``device``."""
    env = {**TINY_MODEL, "TRADEAGENT__SYNTH__EVENTS_PER_SECOND": "2", "TRADEAGENT__DEVICE": device}
    return bench_json(
        "backtest",
        *("--records", "20000", "--event-records", "5000", "--chunks", "4"),
        data_dir=data_dir,
        env=env,
    )
