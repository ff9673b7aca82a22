"""``tradeagent demo`` end to end, as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from feeds.features import FEATURE_NAMES


def test_demo_writes_data_and_summarises_features(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--days", "1", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert [row["feature"] for row in summary["features"]] == list(FEATURE_NAMES)
    assert {row["symbol"] for row in summary["instruments"]} == {"ES", "NQ"}
    for row in summary["instruments"]:
        assert row["records"] > 10_000
        assert row["bars"] > 1_000
        assert row["tradable_share"] > 0.99  # the synthetic feed is healthy
    assert len(list(out.glob("*.dbn.zst"))) == 1


def test_demo_rejects_a_bad_option(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--days", "0", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--days" in proc.stderr
