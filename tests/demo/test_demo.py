"""``tradeagent demo`` end to end as a real subprocess (the reduced ``--quick`` profile: short
sessions, a tiny training schedule, 20 s of paper trading on a real NATS feed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.bench.nats_server import NatsServerUnavailable, find_nats_server
from tests.conftest import skip_or_fail


def test_quick_demo_runs_every_step(tmp_path: Path) -> None:
    try:
        find_nats_server()
    except NatsServerUnavailable as exc:
        skip_or_fail(str(exc))
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--quick", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "demo-summary.json").read_text())
    assert len(list((out / "data").glob("*.dbn.zst"))) == 3
    assert summary["candidate_sha256"]
    # what the gate scored, as traded, is what the demo reports (and the training report shows)
    train = json.loads((out / "reports" / "train.json").read_text())
    gate = summary["gate"]
    assert gate["passed"] is summary["promoted"] is train["gate"]["passed"]
    assert gate["pnl"] == train["oos"]["pnl"] and gate["costs"] == train["oos"]["costs"]
    assert "the gate scored it as traded" in " ".join(proc.stderr.split())  # the console wraps lines
    assert f"gate (as traded): {'promoted' if gate['passed'] else 'not promoted'}" in proc.stdout
    assert "as traded" in Path(summary["train_report"]).read_text()
    for key in ("train_report", "backtest_report", "backtest_summary", "database", "paper_config"):
        assert Path(summary[key]).is_file(), key
    backtest = json.loads(Path(summary["backtest_summary"]).read_text())
    assert backtest["mode"] == "fast"
    assert backtest["first_day"] == backtest["last_day"]  # the held-out day only
    assert set(backtest["baselines"]) == {"flat", "random", "long"}
    # the paper daemon took decisions on bars that came through NATS
    assert summary["paper"]["counts"].get("decisions", 0) > 0
    assert all(Path(log).is_file() for log in summary["logs"])
    assert str(out / "reports") in proc.stdout and "database:" in proc.stdout


def test_demo_rejects_a_bad_option(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--days", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "--days" in proc.stderr
