"""``tradeagent bench daemon --json`` end to end on a short feed (a real nats-server, a relay
subprocess and the daemon in the benchmark's process, measured from its telemetry and two wrapped
public calls): one JSON object with every documented key, whose figures are sane."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.support.bench import bench_json
from tests.support.nats_server import NatsServerUnavailable, find_nats_server

pytestmark = pytest.mark.slow

KEYS = {
    "p50_ms",
    "p99_ms",
    "decision_p50_ms",
    "decision_p99_ms",
    "decision_samples",
    "records_per_s",
    "decide_p50_ms",
    "decide_p99_ms",
    "decide_calls",
    "decide_rows",
    "decide_device_us",
    "feed_runs",
    "ledger_p50_ms",
    "ledger_p99_ms",
    "orders",
    "decisions",
    "bars_dropped",
    "instruments",
    "seconds",
    "device",
}


def test_bench_daemon_prints_one_json_object_with_its_keys(tmp_path: Path) -> None:
    try:
        find_nats_server()
    except NatsServerUnavailable as exc:
        skip_or_fail(str(exc))
    # The configured model shape (K = 32): its windows fill after 8 s of 0.25 s bars.
    result = bench_json(
        "daemon",
        *("--instruments", "2", "--rate", "1000", "--seconds", "15", "--bar", "0.25"),
        data_dir=tmp_path / "data",
        env={},
    )
    assert set(result) == KEYS
    assert result["instruments"] == 2 and result["device"] == "NumPy on the CPU"
    assert result["orders"] > 0 and result["decisions"] >= result["decide_calls"] > 0
    assert 0 < result["p50_ms"] <= result["p99_ms"]
    assert 0 < result["decide_p50_ms"] <= result["decide_p99_ms"]
    assert 1 <= result["decide_rows"] <= 2 and result["decide_device_us"] is None  # two instruments, CPU
    # Every bar that may trade is timed: at least as many as the orders, at most every decision.
    assert result["orders"] <= result["decision_samples"] <= result["decisions"]
    assert 0 < result["decision_p50_ms"] <= result["decision_p99_ms"]
    assert 0 < result["ledger_p50_ms"] <= result["ledger_p99_ms"]
    assert result["records_per_s"] > 0 and result["feed_runs"] > 0
