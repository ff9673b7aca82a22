"""``tradeagent demo`` end to end as a real subprocess (the reduced ``--quick`` profile: short
sessions, a tiny training schedule, 20 s of paper trading on a real NATS feed), then a second
run on the same ``--out``, which must trade what is promoted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_config
from storage import ModelRegistry, open_database
from tests.conftest import skip_or_fail
from tests.daemon.support import install_model, model_checkpoint
from tests.support.nats_server import NatsServerUnavailable, find_nats_server


def _demo(out: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--quick", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, json.loads((out / "demo-summary.json").read_text())


def _promoted(out: Path) -> str | None:
    config = load_config(out / "paper.toml", env={})
    with open_database(config.storage, config.data_dir) as database:
        record = ModelRegistry(database).current_promoted("ES,NQ")
    return record.sha256 if record is not None else None


def _check_traded(
    proc: subprocess.CompletedProcess[str], summary: dict[str, Any], incumbent: str | None
) -> None:
    """The demo's rule: the promoted candidate, else the promoted incumbent, else the candidate
    labelled as not promoted; the backtest and the paper daemon trade it, and the output says so."""
    candidate = summary["candidate_sha256"]
    if summary["promoted"]:
        expected, label = candidate, f"the new candidate {candidate[:12]}, promoted"
    elif incumbent is not None:
        expected, label = incumbent, f"the promoted incumbent {incumbent[:12]}"
    else:
        expected, label = candidate, "nothing is promoted for ES,NQ: the unpromoted candidate"
    assert summary["traded_sha256"] == expected
    assert summary["traded_model"].startswith(label)
    assert summary["paper"]["model"] == expected  # what the paper daemon served
    assert f"model traded:     {label}" in proc.stdout
    assert "model traded in steps 3 and 4:" in proc.stderr


@pytest.fixture(scope="module")
def first_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str], dict[str, Any]]:
    try:
        find_nats_server()
    except NatsServerUnavailable as exc:
        skip_or_fail(str(exc))
    out = tmp_path_factory.mktemp("demo") / "demo"
    proc, summary = _demo(out)
    return out, proc, summary


def test_quick_demo_runs_every_step(
    first_run: tuple[Path, subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    out, proc, summary = first_run
    _check_traded(proc, summary, None)  # a fresh --out: nothing was promoted before
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


def test_a_second_run_on_the_same_out_trades_what_is_promoted(
    first_run: tuple[Path, subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    """The second run keeps the first one's registry. So that it has an incumbent whatever the
    first run's gate decided, a checkpoint is promoted first when the first run promoted none;
    then the second candidate is traded only if it was promoted, else the incumbent is."""
    out, _, first = first_run
    incumbent = _promoted(out)
    if incumbent is None:
        incumbent = install_model(load_config(out / "paper.toml", env={}), *model_checkpoint())
    proc, summary = _demo(out)
    assert summary["candidate_sha256"] != first["candidate_sha256"]  # a new run, a new candidate
    _check_traded(proc, summary, incumbent)
    assert _promoted(out) == (summary["candidate_sha256"] if summary["promoted"] else incumbent)
    backtest = json.loads(Path(summary["backtest_summary"]).read_text())
    assert backtest["checkpoint_sha256"] == summary["traded_sha256"]
    assert summary["paper"]["counts"].get("decisions", 0) > 0  # the feed reached it again


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
