"""The backtest report renders in a real headless Chromium: every plot is an SVG with drawn
marks after the page has loaded. Without Chromium the test skips locally and fails under CI
(``.ci/run`` installs Debian's ``chromium``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from agent.backtest.api import BacktestRequest, run_backtest
from agent.reports.backtest import write_backtest
from tests.backtest.conftest import backtest_config, synth_days
from tests.backtest.test_parity import _Quiet
from tests.conftest import skip_or_fail
from tests.daemon.support import model_checkpoint

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
EXPECTED_PLOTS = (
    "Cumulative P&amp;L after costs: candidate, flat and always long",
    "Cumulative P&amp;L after costs: with the random baseline",
    "Drawdown of the candidate",
    "Position (contracts)",
    "Kelly size of each decision, signed by direction",
    "Regime scale",
    "Share of valid decisions per action",
    "Net P&amp;L per instrument",
    "Net P&amp;L per day (UTC)",
    "Decisions per latency bucket (microseconds)",
)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    skip_or_fail("headless Chromium is not installed (apt-get install chromium)")
    raise AssertionError("unreachable")


def test_report_plots_render_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    data = synth_days(tmp_path / "data", signal=0.5, days=1, seed=5)
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(model_checkpoint(seed=1)[0])
    result = run_backtest(
        backtest_config(tmp_path / "state"),
        BacktestRequest(data=data, checkpoint=str(ckpt), fast=True, chunks=2),
        _Quiet(),
    )
    report, _ = write_backtest(result, tmp_path / "out")
    done = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    svgs = re.findall(r"<svg\b.*?</svg>", dom, flags=re.S)
    labels = [re.search(r'aria-label="([^"]*)"', svg).group(1) for svg in svgs]  # type: ignore[union-attr]
    assert labels == list(EXPECTED_PLOTS)
    for svg in svgs:
        assert "no data" not in svg, svg[:200]
        drawn = re.findall(r'<polyline points="([^"]+)"', svg) + re.findall(
            r'<rect [^>]*width="([\d.]+)"', svg
        )
        assert any(p.strip() and p.strip() != "0.0" for p in drawn), f"an empty plot: {svg[:200]}"
