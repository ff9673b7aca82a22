"""``tradeagent bench infer --json`` end to end on the CPU with a small model: one JSON object with
every documented key of the CPU path; the figures are measurements, so only their sanity is
checked. On a CUDA device the same command adds the round trip to a resident kernel (also tested
on its own) and each call's split into device and host time, at 1, 64 and 4096 rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.bench.infer import resident_round_trip_us
from tests.support.bench import TINY_MODEL, bench_json

KEYS = {
    "device",
    "device_name",
    "floor_kind",
    "floor_us",
    "p50_us_b1",
    "p99_us_b1",
    "p50_us_b64",
    "p99_us_b64",
    "p50_us_b1_vs_floor",
    "p99_us_b1_vs_floor",
    "p50_us_b64_vs_floor",
    "p99_us_b64_vs_floor",
    "decisions_per_s_b4096",
    "train_batch",
    "train_samples_per_s",
    "train_kind",
    "window",
    "features",
}


def test_bench_infer_on_the_cpu_prints_its_keys(tmp_path: Path) -> None:
    result = bench_json(
        "infer",
        "--device",
        "cpu",
        "--iterations",
        "100",
        "--train-batch",
        "64",
        data_dir=tmp_path,
        env=TINY_MODEL,
    )
    assert set(result) >= KEYS, KEYS - set(result)
    assert result["device"] == "cpu" and result["train_kind"] == "array code" and result["train_batch"] == 64
    assert 0 < result["p50_us_b1"] <= result["p99_us_b1"] and result["decisions_per_s_b4096"] > 0
    assert result["train_samples_per_s"] > 0 and result["window"] == 4
    assert not [k for k in result if k.startswith(("device_us", "host_us"))]  # no device timer


@pytest.mark.gpu
def test_bench_infer_on_a_device_splits_each_call_into_device_and_host(tmp_path: Path) -> None:
    result = bench_json(
        "infer",
        *("--device", "cuda", "--iterations", "100", "--train-batch", "64", "--no-cpu-reference"),
        data_dir=tmp_path,
        env=TINY_MODEL,
    )
    assert set(result) >= KEYS | {"resident_floor_us", "resident_floor_p99_us"}, KEYS - set(result)
    assert result["device"] == "cuda"
    for rows in (1, 64, 4096):
        device, host = result[f"device_us_b{rows}"], result[f"host_us_b{rows}"]
        assert device > 0 and host > 0, (rows, device, host)
    # the split is of the very calls timed: device + host is one call's median time, at most the
    # slowest call (p99 where it is measured; at 4096 rows, no faster than the measured rate)
    assert result["device_us_b1"] + result["host_us_b1"] <= result["p99_us_b1"] * 1.5
    per_call_us = 4096 / result["decisions_per_s_b4096"] * 1e6
    assert 0.5 * per_call_us < result["device_us_b4096"] + result["host_us_b4096"] < 2 * per_call_us


@pytest.mark.gpu
def test_the_resident_kernel_echoes_every_number_then_returns() -> None:
    # Each timed round trip waits for its own number (a kernel that missed one would time out),
    # and the call returns only once the kernel has left the device.
    p50, p99 = resident_round_trip_us(200, timeout_s=2.0)
    assert 0 < p50 <= p99 < 2e6
