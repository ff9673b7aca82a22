"""The NATS source against a real nats-server: relay round trip, rejected messages, gaps, a
server killed and restarted mid-stream (JetStream and core), and a stream of the configured name
that records other subjects (refused, left alone)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from feeds.config import RelayConfig
from feeds.errors import FeedError
from feeds.lifecycle import State
from feeds.relay import Relay
from feeds.sources import (
    HealthEvent,
    HealthKind,
    NatsSource,
    RecordBatch,
    ReplaySource,
    SourceEvent,
)
from feeds.sources.nats_session import NatsSession, NatsUnavailable
from feeds.sources.nats_wire import MessageEncoder
from tests.support.feed_data import DATASET, SYMBOLS, feed_records, sorted_by_key, write_feed
from tests.support.nats_server import NatsServer

STREAM = "MBP10"
ES_SUBJECT = "md.mbp10.GLBX-MDP3.ES"
WAIT_S = 30.0  # liveness bound only: every wait below normally ends in well under a second


class Collector:
    """Reads a source in the background, keeping records and health events."""

    def __init__(self, source: NatsSource) -> None:
        self.source = source
        self.batches: list[np.ndarray] = []
        self.received = 0
        """Records taken so far (cheap to poll, unlike :attr:`records`)."""
        self.health: list[HealthEvent] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Collector:
        await self.source.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await self.source.stop()

    async def _run(self) -> None:
        async for event in self.source:
            self._take(event)

    def _take(self, event: SourceEvent) -> None:
        if isinstance(event, RecordBatch):
            self.batches.append(event.records.copy())
            self.received += len(event)
        else:
            self.health.append(event)
        self._changed.set()

    @property
    def records(self) -> np.ndarray:
        return np.concatenate(self.batches) if self.batches else np.empty(0, dtype=feed_records(1).dtype)

    def kinds(self) -> list[HealthKind]:
        return [event.kind for event in self.health]

    async def until(self, done: Callable[[Collector], bool]) -> None:
        async def wait() -> None:
            while not done(self):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), WAIT_S)


def nats_source(server: NatsServer, **kwargs: object) -> NatsSource:
    options: dict[str, object] = {"url": server.url, "dataset": DATASET, "stale_after_s": 60.0}
    options.update(kwargs)
    return NatsSource(**options)  # type: ignore[arg-type]


async def relay_file(server: NatsServer, path: Path, batch_records: int = 256) -> int:
    relay = Relay(
        ReplaySource(path, batch_records=1000),
        url=server.url,
        stream=STREAM,
        dataset=DATASET,
        symbols=SYMBOLS,
        config=RelayConfig(batch_records=batch_records, max_in_flight=64),
    )
    counters = await relay.run()
    return counters.records


def same_feed(got: np.ndarray, expected: np.ndarray) -> None:
    """Exactly the same records: per instrument in the same order, and overall the same set."""
    assert len(got) == len(expected)
    for instrument_id in SYMBOLS:
        mine = got[got["instrument_id"] == instrument_id]
        theirs = expected[expected["instrument_id"] == instrument_id]
        assert mine.tobytes() == theirs.tobytes()
    assert sorted_by_key(got).tobytes() == sorted_by_key(expected).tobytes()


@pytest.mark.parametrize("mode", ["jetstream", "core"])
async def test_relay_round_trip_gives_exactly_the_records_of_the_file(
    nats_server: NatsServer, tmp_path: Path, mode: str
) -> None:
    records = feed_records(5000)
    path = write_feed(tmp_path / "feed.dbn.zst", records)
    async with Collector(nats_source(nats_server, mode=mode)) as sink:
        assert await relay_file(nats_server, path) == len(records)
        await sink.until(lambda c: len(c.records) >= len(records))
        same_feed(sink.records, records)
        assert sink.health == []
        assert sink.source.counters.rejected_messages == 0


async def test_durable_consumer_reads_the_stream_from_the_start(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(2000)
    await relay_file(nats_server, write_feed(tmp_path / "feed.dbn", records))
    async with Collector(nats_source(nats_server, durable="late-reader")) as sink:
        await sink.until(lambda c: len(c.records) >= len(records))
        same_feed(sink.records, records)


async def test_a_receipt_acknowledging_durable_acknowledges_all_it_took_and_resumes_after_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(2000)
    half = len(records) // 2
    await relay_file(nats_server, write_feed(tmp_path / "first.dbn", records[:half]))
    observer = NatsSession(nats_server.url, "test-observer")
    await observer.connect()
    try:
        async with Collector(nats_source(nats_server, durable="daemon", fetch_batch=16)) as sink:
            await sink.until(lambda c: len(c.records) >= half)
            last = sink.source.last_stream_seq
            # Acknowledged with the next pull request: once the open one is served or expires.
            for _ in range(int(WAIT_S / 0.05)):
                info = await observer.js.consumer_info(STREAM, "daemon")
                if info.ack_floor is not None and info.ack_floor.stream_seq == last:
                    break
                await asyncio.sleep(0.05)
            assert info.ack_floor is not None and info.ack_floor.stream_seq == last
            assert info.num_ack_pending == 0
        await relay_file(nats_server, write_feed(tmp_path / "second.dbn", records[half:]))
        async with Collector(nats_source(nats_server, durable="daemon")) as sink:
            await sink.until(lambda c: len(c.records) >= len(records) - half)
            same_feed(sink.records, records[half:])
            assert sink.source.counters.duplicates == 0
    finally:
        await observer.close()


@pytest.mark.parametrize("mode", ["jetstream", "core"])
async def test_messages_that_are_not_mbp10_dbn_are_counted_and_rejected(
    nats_server: NatsServer, mode: str
) -> None:
    good = feed_records(10)
    es = good[good["instrument_id"] == 1001]
    wrong_rtype = es[:1].copy()
    wrong_rtype["rtype"] = 0x77
    bad = [b"hello, not DBN", es[:1].tobytes()[:100], wrong_rtype.tobytes(), es[:2].tobytes() + b"\x00" * 7]
    publisher = NatsSession(nats_server.url, "test-publisher")
    await publisher.connect()
    await publisher.ensure_stream(STREAM, 3600.0)
    try:
        async with Collector(nats_source(nats_server, mode=mode)) as sink:
            for payload in [*bad, es.tobytes()]:
                await publisher.js.publish(ES_SUBJECT, payload)
            await sink.until(lambda c: len(c.records) >= len(es) and len(c.health) >= len(bad))
            assert sink.kinds() == [HealthKind.REJECTED] * len(bad)
            assert [event.bytes for event in sink.health] == [len(p) for p in bad]
            assert sink.records.tobytes() == es.tobytes()
            counters = sink.source.counters
            assert counters.rejected_messages == len(bad)
            assert counters.rejected_bytes == sum(len(p) for p in bad)
    finally:
        await publisher.close()


async def test_relay_sequence_jump_is_reported_as_a_gap(nats_server: NatsServer) -> None:
    records = feed_records(30)
    es = records[records["instrument_id"] == 1001]
    encoder = MessageEncoder(DATASET, batch_records=10)
    messages, _ = encoder.encode(es, {1001: "ES"})  # three messages, Md-Seq 1..3
    publisher = NatsSession(nats_server.url, "test-publisher")
    await publisher.connect()
    try:
        async with Collector(nats_source(nats_server, mode="core")) as sink:
            for message in (messages[0], messages[2]):  # the second one is lost
                await publisher.client.publish(message.subject, message.payload, headers=message.headers)
            await sink.until(lambda c: len(c.batches) >= 2)
            assert sink.kinds() == [HealthKind.GAP]
            assert sink.health[0].sequence_gap == 1
            assert sink.source.counters.gaps == 1
    finally:
        await publisher.close()


async def test_jetstream_source_survives_a_server_kill_and_misses_nothing(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    records = feed_records(3000)
    half = len(records) // 2
    first = write_feed(tmp_path / "first.dbn", records[:half])
    second = write_feed(tmp_path / "second.dbn", records[half:])
    # An ephemeral consumer: the harder case, it may be gone after the restart and is re-created
    # from the last stream sequence seen.
    async with Collector(nats_source(nats_server, mode="jetstream")) as sink:
        await relay_file(nats_server, first)
        await sink.until(lambda c: len(c.records) >= half)
        nats_server.kill()
        nats_server.start()
        await sink.until(lambda c: HealthKind.RECONNECTED in c.kinds())
        await relay_file(nats_server, second)
        await sink.until(lambda c: len(c.records) >= len(records))
        same_feed(sink.records, records)
        assert sink.kinds()[:2] == [HealthKind.DISCONNECTED, HealthKind.RECONNECTED]
        reconnected = sink.health[1]
        assert reconnected.disconnected_at_ns is not None and reconnected.reconnected_at_ns is not None
        assert reconnected.disconnected_at_ns <= reconnected.reconnected_at_ns
        assert sink.source.counters.reconnects == 1


async def test_core_source_reconnects_resubscribes_and_reports_the_lost_messages(
    nats_server: NatsServer,
) -> None:
    records = feed_records(300)
    es = records[records["instrument_id"] == 1001]
    encoder = MessageEncoder(DATASET, batch_records=50)
    messages, _ = encoder.encode(es, {1001: "ES"})
    publisher = NatsSession(nats_server.url, "test-publisher")
    await publisher.connect()
    try:
        async with Collector(nats_source(nats_server, mode="core")) as sink:
            await publisher.client.publish(
                messages[0].subject, messages[0].payload, headers=messages[0].headers
            )
            await sink.until(lambda c: len(c.batches) == 1)
            nats_server.kill()
            # messages[1:3] are "published" while the server is down: core NATS loses them
            nats_server.start()
            await sink.until(lambda c: HealthKind.RECONNECTED in c.kinds())
            for message in messages[3:]:
                await publisher.client.publish(message.subject, message.payload, headers=message.headers)
            await publisher.client.flush()
            await sink.until(lambda c: len(c.batches) == 1 + len(messages[3:]))
            kinds = sink.kinds()
            assert kinds == [HealthKind.DISCONNECTED, HealthKind.RECONNECTED, HealthKind.GAP]
            gap = sink.health[2]
            assert gap.sequence_gap == 2
            assert gap.disconnected_at_ns == sink.health[0].disconnected_at_ns
            assert gap.reconnected_at_ns is not None
            expected = np.concatenate([es[:50], es[150:]])
            assert sink.records.tobytes() == expected.tobytes()
    finally:
        await publisher.close()


async def test_an_unreachable_server_is_a_clear_feed_error(nats_server: NatsServer) -> None:
    nats_server.stop()
    session = NatsSession(nats_server.url, "test-unreachable", connect_timeout_s=0.5)
    with pytest.raises(NatsUnavailable, match=r"cannot connect to nats://127\.0\.0\.1:\d+ within 0\.5 s"):
        await session.connect()
    source = nats_source(nats_server)
    source._session = session
    with pytest.raises(NatsUnavailable):
        await source.start()
    assert source.state is State.FAULTED


async def test_a_stream_of_that_name_recording_other_subjects_is_refused_and_left_alone(
    nats_server: NatsServer,
) -> None:
    admin = NatsSession(nats_server.url, "test-admin")
    await admin.connect()
    try:
        await admin.js.add_stream(name=STREAM, subjects=["orders.>"])  # another application's stream
        with pytest.raises(FeedError) as refused:
            await admin.ensure_stream(STREAM, 3600.0)
        message = str(refused.value)
        assert message.startswith(
            "JetStream stream 'MBP10' exists but records ['orders.>'], not ['md.mbp10.>']: it is not "
            "the market-data stream; set feeds.source.stream to another name"
        )
        assert len(message.splitlines()) == 1
        source = nats_source(nats_server)
        with pytest.raises(FeedError, match=r"exists but records \['orders\.>'\]"):
            await source.start()
        assert source.state is State.FAULTED
        assert (await admin.js.stream_info(STREAM)).config.subjects == ["orders.>"]
    finally:
        await admin.close()
