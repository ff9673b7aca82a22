"""``tradeagent bench feed --json`` end to end on a small file: one JSON object on stdout with
every documented key (its figures are measurements, so only their sanity is checked here)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import skip_or_fail
from tests.support.bench import bench_json
from tests.support.nats_server import NatsServerUnavailable, find_nats_server

KEYS = {
    "records",
    "bars",
    "vectorised_records_per_s",
    "vectorised_zst_records_per_s",
    "incremental_records_per_s",
    "vectorised_cpu_records_per_s",
    "incremental_cpu_records_per_s",
    "nats_records_per_s",
    "nats_transport_records_per_s",
    "nats_messages",
    "nats_records_per_message",
    "load_average_1m",
}


def test_bench_feed_prints_one_json_object_with_its_keys(tmp_path: Path) -> None:
    try:
        find_nats_server()
    except NatsServerUnavailable as exc:
        skip_or_fail(str(exc))
    result = bench_json(
        "feed",
        *("--records", "3000", "--repeat", "1"),
        data_dir=tmp_path / "data",
        env={"TRADEAGENT__SYNTH__EVENTS_PER_SECOND": "0.5"},  # a small synthetic day is enough
    )
    assert set(result) == KEYS
    assert result["records"] == 3000 and result["bars"] > 0
    assert result["nats_messages"] >= 1
    rates = [value for key, value in result.items() if key.endswith("_per_s")]
    assert all(rate > 0 for rate in rates)
    assert sorted((tmp_path / "data" / "bench").glob("feed-3000-*")) != []
