"""The daemon's parts on their own: risk limits and halts, the retrain scheduler (real
subprocesses: success, failure, timeout, overlap), Prometheus metrics over HTTP, telemetry PUB,
and the daemon's configuration checks."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import urllib.request
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq
import zmq.asyncio

from agent.config import ConfigError, load_config
from agent.control.config import ControlConfig
from agent.control.endpoints import ServerSockets
from agent.daemon.config import ScheduleConfig
from agent.daemon.intake import closing_arrivals
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.scheduler import RetrainResult, RetrainScheduler, default_command
from agent.daemon.telemetry import Telemetry
from agent.trading.config import RiskConfig
from agent.trading.risk import Halts, RiskLimits
from feeds.features import BarFrame
from feeds.records import MBP10_DTYPE
from feeds.sources import HealthEvent, HealthKind
from tests.support.wait import wait_until_async

DAY = 86_400 * 10**9


def test_risk_clamps_positions_and_limits_the_order_rate() -> None:
    risk = RiskLimits(RiskConfig(max_position=2, max_orders_per_minute=3))
    assert (risk.clamp(5), risk.clamp(-7), risk.clamp(1)) == (2, -2, 1)
    for t in (0.0, 1.0, 2.0):
        assert risk.order_allowed(t)
        risk.order_sent(t)
    assert not risk.order_allowed(30.0)
    assert risk.throttled == 1
    assert risk.order_allowed(60.5)  # the first order left the 60 s window


def test_daily_loss_and_drawdown_breaches() -> None:
    risk = RiskLimits(RiskConfig(max_daily_loss=100.0, max_drawdown=150.0))
    risk.start(1000.0, 5 * DAY)
    assert risk.breach(950.0, 5 * DAY + 1) is None
    assert "daily loss" in (risk.breach(899.0, 5 * DAY + 2) or "")
    # A new UTC day resets the day's reference but not the session's peak.
    fresh = RiskLimits(RiskConfig(max_daily_loss=100.0, max_drawdown=150.0))
    fresh.start(1000.0, 5 * DAY)
    assert fresh.breach(1100.0, 5 * DAY + 1) is None
    assert fresh.breach(1000.0, 6 * DAY) is None  # new day starts at 1000
    assert "drawdown" in (fresh.breach(945.0, 6 * DAY + 1) or "")
    # A halted round only follows the equity (no reason is built): the day and the peak move
    # as breach() moves them.
    halted = RiskLimits(RiskConfig(max_daily_loss=100.0, max_drawdown=150.0))
    halted.start(1000.0, 5 * DAY)
    assert halted.observe(1200.0, 5 * DAY + 1) == (-200.0, 0.0)  # a new peak
    assert halted.observe(1000.0, 6 * DAY) == (0.0, 200.0)  # a new day at 1000, peak kept
    assert "drawdown" in (halted.breach(1000.0, 6 * DAY + 1) or "")


def test_halts_latch_until_resume_and_conditions_clear_themselves() -> None:
    halts = Halts()
    assert not halts
    halts.set("database", "down")
    halts.set("risk", "loss")
    assert halts and "database: down" in halts.describe()
    assert halts.resume() == ["risk"]
    assert list(halts.active) == ["database"]
    assert halts.clear("database") and not halts


async def _scheduler(
    tmp_path: Path, script: str, timeout_s: float = 30.0
) -> tuple[RetrainScheduler, list[RetrainResult]]:
    results: list[RetrainResult] = []
    code = tmp_path / "job.py"
    code.write_text(script, encoding="utf-8")
    config = ScheduleConfig(cron="0 3 * * *", timeout_s=timeout_s)
    return RetrainScheduler(config, [sys.executable, str(code)], results.append), results


async def test_retrain_success_failure_and_timeout_are_reported_not_raised(tmp_path: Path) -> None:
    ok, results = await _scheduler(tmp_path, "print('promoted')")
    assert (await ok.trigger()).outcome == "ok" and "promoted" in results[0].tail
    failed, results = await _scheduler(tmp_path, "import sys; sys.exit(3)")
    result = await failed.trigger()
    assert (result.outcome, result.returncode) == ("failed", 3)
    # A job that outlives its timeout (the sleep is the job under test, not a wait of the test).
    slow, results = await _scheduler(tmp_path, "import time; time.sleep(60)", timeout_s=0.5)
    assert (await slow.trigger()).outcome == "timeout"
    assert not slow.busy


async def test_at_most_one_retrain_at_a_time(tmp_path: Path) -> None:
    release = tmp_path / "release"
    os.mkfifo(release)
    # The job runs until the test opens the FIFO for writing and closes it.
    scheduler, results = await _scheduler(tmp_path, f"open({str(release)!r}).read()")
    first = asyncio.create_task(scheduler.trigger())
    await wait_until_async(lambda: scheduler.busy, 10, "the first retrain to start")
    assert (await scheduler.trigger()).outcome == "skipped"
    await asyncio.to_thread(release.write_bytes, b"")
    assert (await first).outcome == "ok"
    assert [r.outcome for r in results] == ["skipped", "ok"]


async def test_cron_schedule_starts_and_stops_inside_the_loop(tmp_path: Path) -> None:
    scheduler, _ = await _scheduler(tmp_path, "pass")
    scheduler.start()
    await scheduler.stop()
    with pytest.raises(ValueError, match=r"^cron: '61 \* \* \* \*'"):  # refused when built
        ScheduleConfig(cron="61 * * * *")


def test_default_retrain_command() -> None:
    cmd = default_command("config/paper.toml")
    assert cmd[1:] == ["-m", "agent.cli", "--config", "config/paper.toml", "train", "--promote"]


def test_one_count_feeds_the_status_and_prometheus_served_on_localhost() -> None:
    metrics = DaemonMetrics()
    metrics.order_sent("ES", "buy", 0.0012)
    metrics.decision("ES", "long")
    metrics.decision("NQ", "flat")
    metrics.fill("ES", 2, position=2)
    metrics.dropped("stale_decision")
    metrics.feed_event(HealthEvent(HealthKind.REJECTED, 0, "junk", count=3))
    metrics.feed_event(HealthEvent(HealthKind.GAP, 0, "gap"))
    metrics.count("inference_failures")
    metrics.include(lambda: {"throttled_orders": 4})
    metrics.set_model("ab" * 32)
    metrics.set_model("cd" * 32)
    metrics.serve("127.0.0.1", 0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5).read().decode()
    finally:
        metrics.close()
    assert metrics.counts() == {
        "orders": 1,
        "decisions": 2,
        "fills": 1,
        "stale_decisions": 1,
        "rejected_messages": 3,
        "feed_gap": 1,
        "inference_failures": 1,
        "throttled_orders": 4,
    }
    for line in (
        'tradeagent_orders_total{instrument="ES",side="buy"} 1.0',
        "tradeagent_decision_latency_seconds_count 1.0",
        'tradeagent_decisions_total{action="long",instrument="ES"} 1.0',
        'tradeagent_fills_total{instrument="ES"} 1.0',
        'tradeagent_filled_contracts_total{instrument="ES"} 2.0',
        'tradeagent_position_contracts{instrument="ES"} 2.0',
        'tradeagent_drops_total{kind="stale_decision"} 1.0',
        'tradeagent_rejections_total{kind="feed_bytes"} 3.0',
        'tradeagent_feed_gaps_total{kind="gap"} 1.0',
    ):
        assert line in body, line
    assert f'sha256="{"cd" * 32}"' in body and f'sha256="{"ab" * 32}"' not in body


async def test_telemetry_publishes_json_by_topic(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path / 'run' / 'telemetry.sock'}"
    telemetry = Telemetry(ServerSockets(ctx, ControlConfig()), endpoint)
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(b"fill")
    sub.connect(endpoint)
    try:
        got: list[bytes] = []
        for _ in range(100):  # a late joiner misses early messages: publish until one arrives
            telemetry.publish("decision", {"x": 0})
            telemetry.publish("fill", {"qty": 2})
            if await sub.poll(20):
                got = await sub.recv_multipart()
                break
        assert got[0] == b"fill" and msgspec.json.decode(got[1]) == {"qty": 2}
    finally:
        sub.close(linger=0)
        telemetry.close()
        ctx.destroy(linger=0)


def test_configuration_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    for text, key in (
        ("[risk]\nmax_daily_loss = -1.0\n", "risk"),
        ('[schedule]\ncron = "every night"\n', "schedule"),
        ('[control]\nendpoint = "tcp://0.0.0.0:5555"\n', "control"),
        ("[broker]\nlatency_ms = -2.0\n", "broker"),
        ("[daemon]\ndecision_queue = 0\n", "daemon"),
    ):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError, match=key):
            load_config(path, env={})


@pytest.mark.parametrize("name", ["paper", "live"])
def test_shipped_profiles_load(name: str) -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "config" / f"{name}.toml", env={})
    assert config.daemon.mode == name
    assert config.broker.mode == ("paper" if name == "paper" else "gateway")


def test_a_bar_close_is_timed_from_the_batch_holding_its_closing_record() -> None:
    """In a run of batches, each instrument's close counts from the arrival of its first record
    stamped at or after the bar's close, not from the run's first batch."""
    records = np.zeros(6, dtype=MBP10_DTYPE)
    records["instrument_id"] = [1, 2, 1, 2, 2, 1]
    records["ts_recv"] = [90, 95, 101, 99, 102, 103]
    arrivals = np.array([1_000, 1_000, 2_000, 3_000, 4_000, 5_000], dtype=np.int64)
    one = dataclasses.replace(BarFrame.empty(1, "A"), ts_close=np.array([100], dtype=np.int64))
    two = dataclasses.replace(BarFrame.empty(2, "B"), ts_close=np.array([50, 100], dtype=np.int64))
    late = dataclasses.replace(BarFrame.empty(1, "A"), ts_close=np.array([200], dtype=np.int64))
    # instrument 1 crosses 100 at ts 101 (second batch); instrument 2 at ts 102 (fourth batch);
    # a close no record of this run reached takes the run's first arrival
    assert closing_arrivals(records, arrivals, [one, two, late]) == [2_000, 4_000, 1_000]
    records["ts_recv"][3] = 104  # a record stamped late, then one stamped earlier: the running maximum
    assert closing_arrivals(records, arrivals, [two]) == [3_000]
