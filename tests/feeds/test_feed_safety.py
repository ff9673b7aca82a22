"""Feed safety and recovery against a real nats-server (issue 12, points 3, 11, 12 and 15).

* A server older than 2.10 (as announced through a protocol proxy in front of the real server)
  is refused for a multi-subject consumer; a server that ignores the filter (the proxy drops
  ``filter_subjects`` on its way, as such a server does) feeds no record of another dataset.
* Records of another dataset or of an instrument that is not configured are counted and never
  passed on (NATS and replay, real DBN bytes); a stale feed names the dataset the stream holds.
* A time regression is reported at its first record, once per episode.
* ``tradeagent relay`` killed mid-file and restarted at real-time pace resumes after the
  stream's last message at once (the records it skips are not paced): the consumer sees every
  record once, in order, without a regression.
* SIGTERM stops the relay within its stop timeout, with the stream deleted under it and with a
  server that stops answering.
* A durable consumer restarted on another dataset is re-created on its subjects (records
  flow, the log names its old filter); one re-created under a running source by another
  configuration is named in the refusal, not the server's version.
* The daemon, fed SYNTH records through a server that ignores its filter, counts them in
  ``ctl status``, places no order and names the mismatch in its log; a publisher restarted from
  an earlier point is one ``feed_time_regression`` in its counts.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nats.js.errors
import numpy as np
import pytest

from feeds.dbn import write_mbp10
from feeds.errors import FeedError
from feeds.health import ArrivalClock
from feeds.lifecycle import State
from feeds.sources import HealthKind, RecordBatch, ReplaySource
from feeds.sources.nats_session import NatsSession
from feeds.sources.nats_wire import MessageEncoder, WireMessage
from tests.daemon.support import (
    DaemonProcess,
    config_text,
    install_model,
    model_checkpoint,
    synth_feed,
    write_config,
)
from tests.feeds.nats_proxy import NatsProxy
from tests.feeds.test_recorder import TRADEAGENT, WAIT_S, run_env
from tests.feeds.test_sources_nats import STREAM, Collector, nats_source, relay_file, same_feed
from tests.support.feed_data import DATASET, SYMBOLS, feed_records, write_feed
from tests.support.nats_server import NatsServer
from tests.support.wait import wait_until

STOP_TIMEOUT_S = 3.0
EXIT_MARGIN_S = 2.0
"""Interpreter shutdown after the relay's own stop (generous: the machine is shared)."""


def write_dataset(path: Path, records: np.ndarray, dataset: str) -> Path:
    ts = records["ts_recv"]
    return write_mbp10(
        path, records, dataset=dataset, symbols=SYMBOLS, start_ns=int(ts[0]), end_ns=int(ts[-1]) + 1
    )


async def stream_messages(server: NatsServer) -> int:
    """Messages the market-data stream holds now (0 while it does not exist)."""
    session = NatsSession(server.url, "test-probe")
    await session.connect()
    try:
        return int((await session.js.stream_info(STREAM)).state.messages)
    except nats.js.errors.NotFoundError:  # not created yet, or deleted
        return 0
    finally:
        await session.close()


def holds_messages(server: NatsServer) -> bool:
    return asyncio.run(stream_messages(server)) > 0


@contextmanager
def relay(
    path: Path, url: str, tmp_path: Path, *, pace: float, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """``tradeagent relay --json`` of ``path`` to ``url``, its stderr to ``log``; killed on the
    way out unless the test reaped it."""
    env = run_env(tmp_path)
    env["TRADEAGENT__FEEDS__RELAY__STOP_TIMEOUT_S"] = str(STOP_TIMEOUT_S)
    args = [
        "relay",
        "--source",
        "replay",
        "--path",
        str(path),
        "--pace",
        str(pace),
        "--nats-url",
        url,
        "--json",
    ]
    with log.open("ab") as err:
        proc = subprocess.Popen([*TRADEAGENT, *args], env=env, stdout=subprocess.PIPE, stderr=err)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate(timeout=30)


def stopped_in_time(proc: subprocess.Popen[bytes], log: Path) -> tuple[dict[str, int], str]:
    """SIGTERM the relay ``proc``: it exits 0 within its stop timeout (and the margin); its JSON
    counters and its ``log``."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=STOP_TIMEOUT_S + 30)
    seconds = time.monotonic() - started
    text = log.read_text()
    assert proc.returncode == 0, text
    assert seconds < STOP_TIMEOUT_S + EXIT_MARGIN_S, text
    return (json.loads(out) if out else {}), text


def span_s(records: np.ndarray) -> float:
    return (int(records["ts_recv"][-1]) - int(records["ts_recv"][0])) / 1e9


# ---------------------------------------------------------------- dataset and instrument checks


async def test_an_old_server_is_refused_for_a_multi_subject_consumer(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(200)
    with NatsProxy(nats_server.port, version="2.9.25") as proxy:
        source = nats_source(nats_server, url=proxy.url, symbols=("ES", "NQ"))
        with pytest.raises(FeedError) as caught:
            await source.start()
        message = str(caught.value)
        assert f"{proxy.url}: NATS server 2.9.25 is older than 2.10.0" in message
        assert "stream MBP10 filtered on md.mbp10.GLBX-MDP3.ES, md.mbp10.GLBX-MDP3.NQ" in message
        assert "upgrade nats-server, or set feeds.source.symbols = []" in message
        assert source.state is State.FAULTED
        # One filter (the dataset wildcard) is applied by every server: accepted there.
        async with Collector(nats_source(nats_server, url=proxy.url)) as sink:
            await relay_file(nats_server, write_feed(tmp_path / "feed.dbn", records))
            await sink.until(lambda c: c.received >= len(records))
            same_feed(sink.records, records)


async def test_a_server_ignoring_the_filter_feeds_no_record_of_another_dataset(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    ours = feed_records(300)
    synth = feed_records(200, seed=5)
    await relay_file(nats_server, write_dataset(tmp_path / "synth.dbn", synth, "SYNTH"))
    await relay_file(nats_server, write_feed(tmp_path / "ours.dbn", ours))
    with NatsProxy(nats_server.port, strip_filters=True) as proxy:
        source = nats_source(nats_server, url=proxy.url, symbols=("ES", "NQ"), durable="from-start")
        async with Collector(source) as sink:
            assert proxy.stripped == 1  # the consumer delivers every subject of the stream
            await sink.until(
                lambda c: c.received >= len(ours) and source.counters.rejected_dataset_records > 0
            )
            await sink.until(lambda c: source.counters.rejected_dataset_records == len(synth))
            await sink.until(lambda c: HealthKind.MISMATCH in c.kinds())  # after a look at the consumer
            same_feed(sink.records, ours)
            assert sink.kinds() == [HealthKind.MISMATCH]  # once, for the dataset
            detail = sink.health[0].detail
            assert "NATS subject md.mbp10.SYNTH." in detail and "(dataset SYNTH)" in detail
            assert "md.mbp10.GLBX-MDP3.ES, md.mbp10.GLBX-MDP3.NQ" in detail
            assert "the server holds consumer from-start with no filter" in detail
            assert "or the server dropped the one it was given (nats-server before 2.10 does" in detail
            assert source.counters.rejected_instrument_records == 0


async def test_a_durable_restarted_on_another_dataset_is_re_created_on_its_subjects(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ours = feed_records(300)
    synth = feed_records(200, seed=5)
    await relay_file(nats_server, write_feed(tmp_path / "ours.dbn", ours))
    await relay_file(nats_server, write_dataset(tmp_path / "synth.dbn", synth, "SYNTH"))
    async with Collector(nats_source(nats_server, durable="daemon")) as sink:
        await sink.until(lambda c: c.received >= len(ours))
        same_feed(sink.records, ours)
    # The same durable, restarted with dataset SYNTH: it was filtered on GLBX.MDP3's subjects and
    # would deliver nothing of SYNTH (a feed stale for ever); it is re-created on SYNTH's.
    caplog.clear()
    source = nats_source(nats_server, dataset="SYNTH", durable="daemon")
    async with Collector(source) as sink:
        await sink.until(lambda c: c.received >= len(synth))
        same_feed(sink.records, synth)
        assert sink.health == [] and source.counters.rejected_dataset_records == 0
    assert (
        "consumer daemon on stream MBP10 is filtered on md.mbp10.GLBX-MDP3.>, not on the configured "
        "md.mbp10.SYNTH.> (another feeds.source.dataset or symbols used it): re-creating it on the "
        "configured subjects, delivering from the start of the stream"
    ) in caplog.text
    # And back: GLBX.MDP3's records flow again, none of SYNTH's is delivered, nothing blames the
    # server's version.
    caplog.clear()
    source = nats_source(nats_server, durable="daemon")
    async with Collector(source) as sink:
        await sink.until(lambda c: c.received >= len(ours))
        same_feed(sink.records, ours)
        assert sink.health == [] and source.counters.rejected_dataset_records == 0
    assert "filtered on md.mbp10.SYNTH.>, not on the configured md.mbp10.GLBX-MDP3.>" in caplog.text
    assert "2.10" not in caplog.text


async def test_a_durable_re_created_under_a_running_source_is_named_in_the_refusal(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    synth = feed_records(200, seed=5)
    source = nats_source(nats_server, durable="shared")
    async with Collector(source) as sink:
        # Another configuration (dataset SYNTH) starts on the same durable name: the consumer is
        # re-created on SYNTH's subjects, and this source's pull requests now reach that one.
        other = nats_source(nats_server, dataset="SYNTH", durable="shared")
        await other.start()
        await other.stop()
        await relay_file(nats_server, write_dataset(tmp_path / "synth.dbn", synth, "SYNTH"))
        await sink.until(lambda c: HealthKind.MISMATCH in c.kinds())
        await sink.until(lambda c: source.counters.rejected_dataset_records == len(synth))
        assert sink.kinds() == [HealthKind.MISMATCH] and sink.received == 0
        detail = sink.health[0].detail
        assert "NATS subject md.mbp10.SYNTH." in detail and "(dataset SYNTH)" in detail
        assert "consumer shared on stream MBP10 is now filtered on md.mbp10.SYNTH.>" in detail
        assert "give each configuration its own feeds.source.durable" in detail
        assert "2.10" not in detail


async def test_records_of_an_instrument_not_configured_never_reach_the_consumer(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(400)
    es = records[records["instrument_id"] == 1001]
    last = es[-1:].copy()  # relayed after the feed: once it is in, the whole feed was judged
    for field in ("ts_recv", "ts_event"):
        last[field] += np.uint64(10**9)
    source = nats_source(nats_server, instruments={1001: "ES"})
    async with Collector(source) as sink:
        await relay_file(nats_server, write_feed(tmp_path / "feed.dbn", records))
        await relay_file(nats_server, write_feed(tmp_path / "last.dbn", last))
        await sink.until(lambda c: c.received >= len(es) + 1)
        assert source.counters.rejected_instrument_records == len(records) - len(es)
        assert sink.records.tobytes() == np.concatenate([es, last]).tobytes()
        assert sink.kinds() == [HealthKind.MISMATCH]
        assert sink.health[0].instrument_id == 1002
        assert "instrument 1002, which is not in feeds.instruments (ES (1001))" in sink.health[0].detail


async def test_replay_refuses_a_file_of_another_dataset_and_unconfigured_instruments(tmp_path: Path) -> None:
    ours = feed_records(300)
    later = feed_records(300, seed=3)
    for field in ("ts_recv", "ts_event"):
        later[field] += np.uint64(86_400 * 10**9)  # the next day
    write_feed(tmp_path / "feed" / "day1.dbn", ours)
    foreign = write_dataset(tmp_path / "feed" / "day2.dbn.zst", later, "SYNTH")
    source = ReplaySource(tmp_path / "feed", batch_records=100, dataset=DATASET, instruments={1001: "ES"})
    async with source:
        events = [event async for event in source]
    batches = [e for e in events if isinstance(e, RecordBatch)]
    health = [e for e in events if not isinstance(e, RecordBatch)]
    es = ours[ours["instrument_id"] == 1001]
    assert np.concatenate([b.records for b in batches]).tobytes() == es.tobytes()
    assert [e.kind for e in health] == [HealthKind.MISMATCH, HealthKind.MISMATCH]
    assert health[0].instrument_id == 1002
    assert f"{foreign} holds dataset SYNTH, not the configured GLBX.MDP3" in health[1].detail
    assert 'set feeds.source.dataset = "SYNTH"' in health[1].detail
    counters = source.counters
    assert counters.rejected_dataset_records == len(later)
    assert counters.rejected_instrument_records == len(ours) - len(es)
    assert counters.records == len(es) and counters.messages == len(ours) + len(later)


async def test_a_stale_feed_names_the_dataset_the_stream_holds_once_it_holds_one(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with Collector(nats_source(nats_server, durable="d", stale_after_s=0.3)) as sink:
        await sink.until(lambda c: HealthKind.STALE in c.kinds())  # the stream is empty yet
        await relay_file(nats_server, write_dataset(tmp_path / "synth.dbn", feed_records(100), "SYNTH"))
        await sink.until(lambda c: HealthKind.MISMATCH in c.kinds())
        assert sink.kinds() == [HealthKind.STALE, HealthKind.MISMATCH]
        detail = sink.health[1].detail
        assert "no data on md.mbp10.GLBX-MDP3.>: stream MBP10 holds messages of dataset SYNTH" in detail
        assert "set feeds.source.dataset" in detail and "relay data of GLBX.MDP3" in detail
        assert sink.records.shape[0] == 0


# ---------------------------------------------------------------- time regressions


def test_the_arrival_clock_reports_a_regression_once_per_episode() -> None:
    records = feed_records(100)
    es = records[records["instrument_id"] == 1001]
    clock = ArrivalClock()
    assert clock.observe(records[:120]) == []
    again = clock.observe(es[:10])  # replayed from the start
    assert len(again) == 1
    first = again[0]
    assert (first.instrument_id, first.opened, first.behind, first.ongoing) == (1001, 1, 10, True)
    assert first.ts_ns == int(es["ts_recv"][0])
    seen = int(np.count_nonzero(records[:120]["instrument_id"] == 1001))
    later = clock.observe(es[10 : seen - 1])  # still behind: the same episode
    assert [(found.opened, found.ongoing) for found in later] == [(0, True)]
    assert clock.observe(es[seen:]) == []  # past the clock: the episode is over
    assert [found.opened for found in clock.observe(es[:1])] == [1]  # a new one


async def test_a_time_regression_is_reported_at_its_first_record(nats_server: NatsServer) -> None:
    es = feed_records(300)
    es = es[es["instrument_id"] == 1001]
    first_run, _ = MessageEncoder(DATASET, batch_records=25).encode(es[:200], SYMBOLS)
    replayed, _ = MessageEncoder(DATASET, batch_records=25).encode(es, SYMBOLS)  # a relay from the start
    publisher = NatsSession(nats_server.url, "test-publisher")
    await publisher.connect()
    try:
        async with Collector(nats_source(nats_server, mode="core", instruments=SYMBOLS)) as sink:
            for message in [*first_run, replayed[0]]:
                await publisher.client.publish(message.subject, message.payload, headers=message.headers)
            await sink.until(lambda c: HealthKind.TIME_REGRESSION in c.kinds() and c.received >= 225)
            assert len(sink.records) == 200 + 25  # reported with the first records behind
            event = sink.health[0]
            assert (event.instrument_id, event.count) == (1001, 25)
            assert "ES (1001): ts_recv went back" in event.detail
            for message in replayed[1:]:
                await publisher.client.publish(message.subject, message.payload, headers=message.headers)
            await sink.until(lambda c: c.received == 200 + len(es))
            assert sink.kinds() == [HealthKind.TIME_REGRESSION]  # one episode
            assert sink.source.counters.time_regressions == 1
    finally:
        await publisher.close()


# ---------------------------------------------------------------- the relay: resume and stop


def test_a_relay_killed_mid_file_resumes_after_the_streams_last_message_at_once(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Two kills, every relay paced at real time: the first mid-stream (publishes in flight),
    the second while it sleeps through the file's recorded overnight gap. The third relay skips
    everything the stream holds without pacing it: it publishes the next day's records at once,
    where pacing the skipped ones would first wait out the replayed day."""
    records = feed_records(1500, next_day_from=0.5)
    first_day = len(records) // 2
    feed = write_feed(tmp_path / "feed.dbn", records)
    log = tmp_path / "relay.log"

    async def scenario() -> None:
        source = nats_source(nats_server, durable="daemon")
        async with Collector(source) as sink:
            with relay(feed, nats_server.url, tmp_path, pace=1.0, log=log):
                await sink.until(lambda c: c.received >= first_day // 4)
            # Killed there (mid-stream), and the second one once it waits for the next day.
            with relay(feed, nats_server.url, tmp_path, pace=1.0, log=log) as second:
                await sink.until(lambda c: c.received >= first_day)
                assert second.poll() is None
            with relay(feed, nats_server.url, tmp_path, pace=1.0, log=log) as third:
                await sink.until(lambda c: c.received >= len(records))
                out, _ = await asyncio.to_thread(third.communicate, timeout=60)
            assert third.returncode == 0, log.read_text()
            counters = json.loads(out)
            assert counters["skipped_records"] == first_day
            assert counters["records"] == len(records) - first_day
            assert counters["source"]["records"] == len(records) - first_day
            same_feed(sink.records, records)
            assert source.counters.duplicates == 0
            assert source.counters.time_regressions == 0
            assert HealthKind.TIME_REGRESSION not in sink.kinds()

    asyncio.run(scenario())
    text = log.read_text()
    assert text.count("resuming after the stream's last records: ES at ts_recv") == 2, text


def test_sigterm_stops_the_relay_in_time_when_the_stream_is_deleted_under_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(4000)
    log = tmp_path / "relay.log"
    feed = write_feed(tmp_path / "feed.dbn", records)
    with relay(feed, nats_server.url, tmp_path, pace=span_s(records) / 20, log=log) as proc:
        wait_until(lambda: holds_messages(nats_server), WAIT_S, "the relay to publish")

        async def delete() -> None:
            session = NatsSession(nats_server.url, "test-admin")
            await session.connect()
            try:
                await session.js.delete_stream(STREAM)
            finally:
                await session.close()

        asyncio.run(delete())
        wait_until(lambda: holds_messages(nats_server), WAIT_S, "the stream to be re-created and fed")
        counters, text = stopped_in_time(proc, log)
    assert text.count("no JetStream stream records") == 1, text
    assert counters["messages"] > 0 and counters["abandoned_messages"] == 0


def test_sigterm_stops_the_relay_in_time_when_the_server_stops_answering(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(4000)
    log = tmp_path / "relay.log"
    with NatsProxy(nats_server.port) as proxy:
        feed = write_feed(tmp_path / "feed.dbn", records)
        with relay(feed, proxy.url, tmp_path, pace=span_s(records) / 20, log=log) as proc:
            wait_until(lambda: holds_messages(nats_server), WAIT_S, "the relay to publish")
            proxy.freeze()
            wait_until(lambda: proxy.held > 0, WAIT_S, "a publish to be held back")
            counters, text = stopped_in_time(proc, log)
    assert counters["abandoned_messages"] > 0, text
    assert "left unacknowledged; a relay restarted on the same files publishes them again" in text


# ---------------------------------------------------------------- the daemon


def test_the_daemon_never_trades_another_dataset_and_names_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    feed = synth_feed(tmp_path / "synth")[0]  # dataset SYNTH, ES and NQ
    with NatsProxy(nats_server.port, strip_filters=True) as proxy:
        source = (
            f'kind = "nats"\nnats_url = "{proxy.url}"\ndataset = "{DATASET}"\n'
            'symbols = ["ES", "NQ"]\ndurable = "d"'
        )
        config_path = tmp_path / "daemon.toml"
        extra = "\n[feeds.health]\nstale_after_s = 1.0\n"
        config = write_config(config_path, config_text(tmp_path / "data", source, extra=extra))
        install_model(config, *model_checkpoint())
        relayed = subprocess.run(
            [*TRADEAGENT, "--config", str(config_path), "relay", "--source", "replay", "--path", str(feed)],
            env=run_env(tmp_path),
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert relayed.returncode == 0, relayed.stderr.decode()
        assert (
            b"publishing dataset SYNTH (the source's own) while feeds.source.dataset is GLBX.MDP3"
            in relayed.stderr
        )
        with DaemonProcess(config_path, tmp_path / "daemon.log") as daemon:
            daemon.start()
            status = daemon.wait_until(lambda s: s["counts"].get("feed_mismatch", 0) >= 2)
            assert status["feed"]["rejected_dataset_records"] > 0
            assert status["feed"]["records"] == 0
            assert status["counts"].get("orders", 0) == 0
            assert daemon.terminate(timeout=config.daemon.stop_timeout_s + 5) == 0
    text = (tmp_path / "daemon.log").read_text()
    assert "NATS subject md.mbp10.SYNTH." in text
    assert "stream MBP10 holds messages of dataset SYNTH" in text and "set feeds.source.dataset" in text


def test_the_daemon_counts_a_time_regression_once_per_episode(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A publisher restarted from an earlier point sends ES back in time: the daemon counts one
    ``feed_time_regression`` (and its source one episode) at the first record behind, however
    many records follow until the feed is past its latest time again."""
    es = feed_records(300)
    es = es[es["instrument_id"] == 1001]
    first_run, _ = MessageEncoder(DATASET, batch_records=25).encode(es[:200], SYMBOLS)
    replayed, _ = MessageEncoder(DATASET, batch_records=25).encode(es, SYMBOLS)  # from the start
    source = f'kind = "nats"\nnats_url = "{nats_server.url}"\ndataset = "{DATASET}"\ndurable = "d"'
    config_path = tmp_path / "daemon.toml"
    write_config(config_path, config_text(tmp_path / "data", source))

    async def publish(messages: list[WireMessage]) -> None:
        publisher = NatsSession(nats_server.url, "test-publisher")
        await publisher.connect()
        try:
            for message in messages:
                await publisher.js.publish(message.subject, message.payload, headers=dict(message.headers))
        finally:
            await publisher.close()

    with DaemonProcess(config_path, tmp_path / "daemon.log") as daemon:
        daemon.start()  # its source has created the stream
        asyncio.run(publish([*first_run, replayed[0]]))
        behind = daemon.wait_until(
            lambda s: s["feed"]["records"] == 200 + 25 and s["counts"].get("feed_time_regression", 0) >= 1
        )
        assert behind["counts"]["feed_time_regression"] == 1
        assert behind["feed"]["time_regressions"] == 1
        asyncio.run(publish(replayed[1:]))
        status = daemon.wait_until(lambda s: s["feed"]["records"] == 200 + len(es))
        assert status["feed"]["time_regressions"] == 1  # one episode: the daemon got no second event
        assert status["counts"]["feed_time_regression"] == 1
        assert daemon.terminate() == 0, daemon.log_tail()
    log = daemon.log_tail(1_000_000)
    assert log.count("feed time_regression: ES (1001): ts_recv went back") == 1, log
