"""``tradeagent relay`` and ``tradeagent record`` as real subprocesses against a real
nats-server: the recorder is killed with SIGKILL mid-stream, every file it left is read back with
``databento.DBNStore``, then it is restarted and must finish the archive without duplicates."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import databento
import nats.js.errors
import numpy as np
import pytest
from databento.common.error import BentoWarning

from feeds.recorder import archive_path, day_start_ns
from feeds.sources.nats_session import NatsSession
from tests.support.feed_data import DATASET, feed_records, sorted_by_key, write_feed
from tests.support.nats_server import NatsServer
from tests.support.wait import wait_until

STREAM = "MBP10"
DURABLE = "recorder"
WAIT_S = 60.0  # liveness bound for subprocess progress, never a speed assertion
TRADEAGENT = [sys.executable, "-m", "agent.cli"]
SOURCE_STARTED = "nats:jetstream:GLBX.MDP3: started"  # a recorder's source, once started


def run_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TRADEAGENT_DATA_DIR"] = str(tmp_path / "data")
    env["TRADEAGENT__FEEDS__RECORDER__FLUSH_INTERVAL_S"] = "0.1"
    env["TRADEAGENT__FEEDS__RECORDER__FETCH_BATCH"] = "16"  # small fetches: the kill lands mid-stream
    return env


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen([*TRADEAGENT, *args], env=env, stdout=subprocess.PIPE, stderr=err)


async def consumer_state(server: NatsServer) -> tuple[int, int, int] | None:
    """(ack floor stream sequence, pending, ack pending) of the recorder's durable consumer, or
    None while it does not exist (not created yet, or being re-created by a restarted recorder)."""
    session = NatsSession(server.url, "test-probe")
    await session.connect()
    try:
        info = await session.js.consumer_info(STREAM, DURABLE)
    except nats.js.errors.NotFoundError:
        return None
    finally:
        await session.close()
    return int(info.ack_floor.stream_seq), int(info.num_pending), int(info.num_ack_pending)


def acked_some(server: NatsServer) -> bool:
    state = asyncio.run(consumer_state(server))
    return state is not None and state[0] > 0


def fully_acked(server: NatsServer, messages: int) -> bool:
    state = asyncio.run(consumer_state(server))
    return state is not None and state[0] >= messages and state[1] == 0 and state[2] == 0


def read_archive(out: Path, *, torn_tail_allowed: bool) -> tuple[np.ndarray, list[Path], bool]:
    """Every archive file read with DBNStore: (records, files, whether the newest ended in a torn
    frame). After a kill the newest file may end in a frame cut by the kill; DBNStore reports it
    with a BentoWarning and reads up to it. Any other file must read cleanly."""
    files = sorted(out.glob("*.dbn.zst"))
    parts = []
    torn = False
    for index, path in enumerate(files):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BentoWarning)
            store = databento.DBNStore.from_bytes(path.read_bytes())
            records = np.asarray(store.to_ndarray()).reshape(-1)  # (0, 1) for a file of metadata only
        if caught:
            assert torn_tail_allowed and index == len(files) - 1, [str(w.message) for w in caught]
            torn = True
        assert store.dataset == DATASET
        assert str(store.schema) == "mbp-10"
        ts = records["ts_recv"].astype(np.int64)
        assert np.all(np.diff(ts) >= 0), f"{path.name} is not in ts_recv order"
        if len(records):
            day = day_start_ns(int(ts[0]), 0)
            assert path == archive_path(out, DATASET, day)
            assert int(ts[-1]) < day + 86_400 * 10**9
        parts.append(records)
    empty = np.empty(0, dtype=feed_records(1).dtype)
    return (np.concatenate(parts) if parts else empty), files, torn


@pytest.mark.slow
def test_recorder_killed_mid_stream_loses_nothing_and_resumes_without_duplicates(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(20_000, next_day_from=0.5)  # 40,000 records over two archive days
    feed = write_feed(tmp_path / "feed.dbn.zst", records)
    expected = sorted_by_key(records)
    out = tmp_path / "archive"
    env = run_env(tmp_path)
    log = tmp_path / "subprocess.log"
    record_args = ["record", "--out", str(out), "--nats-url", nats_server.url, "--json"]

    recorder = start(record_args, env, log)
    relay = start(
        ["relay", "--source", "replay", "--path", str(feed), "--nats-url", nats_server.url, "--json"],
        env,
        log,
    )
    try:
        wait_until(lambda: acked_some(nats_server), WAIT_S, "the recorder to acknowledge a first flush")
        recorder.send_signal(signal.SIGKILL)
        recorder.communicate(timeout=WAIT_S)
        relay_out, _ = relay.communicate(timeout=WAIT_S)
        assert relay.returncode == 0, log.read_text()
        relayed = json.loads(relay_out)
        assert relayed["records"] == len(records)
        assert relayed["unknown_records"] == 0

        # What the killed recorder left: readable, in order, a prefix of the feed.
        partial, files, torn = read_archive(out, torn_tail_allowed=True)
        assert files, "the recorder wrote nothing before it was killed"
        assert 0 < len(partial) <= len(records)
        assert sorted_by_key(partial).tobytes() == expected[: len(partial)].tobytes()

        # Restarted, it resumes from its durable consumer and completes the archive.
        recorder = start(record_args, env, log)
        messages = relayed["messages"]
        try:
            # Started (its signal handlers in place): the first recorder may have acknowledged
            # everything before the kill, and SIGTERM must not reach a process still importing.
            wait_until(
                lambda: log.read_text().count(SOURCE_STARTED) == 2, WAIT_S, "the restarted recorder to start"
            )
            wait_until(
                lambda: fully_acked(nats_server, messages), WAIT_S, "the restarted recorder to catch up"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; recorder exit code {recorder.poll()}\n{log.read_text()}") from None
        recorder.send_signal(signal.SIGTERM)
        record_out, _ = recorder.communicate(timeout=WAIT_S)
        assert recorder.returncode == 0, log.read_text()
        summary = json.loads(record_out)
        assert summary["unknown_records"] == 0
        assert summary["out_of_order"] == 0

        complete, files, _ = read_archive(out, torn_tail_allowed=False)
        assert len(complete) == len(records)  # no duplicates, nothing lost
        assert sorted_by_key(complete).tobytes() == expected.tobytes()
        assert [p.name for p in files] == [
            "GLBX-MDP3-20231114.mbp-10.dbn.zst",
            "GLBX-MDP3-20231115.mbp-10.dbn.zst",
        ]
        if not torn:  # a torn frame's readable part is rewritten after the restart cuts it
            assert summary["records_written"] == len(records) - len(partial)
    finally:
        for proc in (recorder, relay):
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=WAIT_S)


def test_relay_reports_a_usage_error_with_exit_code_2(tmp_path: Path) -> None:
    relay = subprocess.run(
        [*TRADEAGENT, "relay", "--source", "replay", "--path", ""],
        env=run_env(tmp_path),
        capture_output=True,
        timeout=WAIT_S,
        check=False,
    )
    assert relay.returncode == 2
    assert b"feeds.source.path is empty" in relay.stderr
