"""Sources without a network: replay (fast and paced), the lifecycle, the bounded queue, the
thread bridge, the subject layout and the NATS wire encoding."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

import feeds.sources
from feeds.dbn import StreamDecoder, read_mbp10
from feeds.dbn.framing import MBP10_SIZE
from feeds.errors import DBNFormatError, FeedError
from feeds.lifecycle import State
from feeds.sources import (
    HealthEvent,
    HealthKind,
    NatsSource,
    QueuedSource,
    RecordBatch,
    ReplaySource,
    dataset_subjects,
    subject_for,
    subject_token,
)
from feeds.sources.nats_wire import (
    MessageEncoder,
    SequenceTracker,
    WireTags,
    parse_tags,
    stream_sequence,
    whole_records,
)
from feeds.sources.thread_bridge import ThreadBridge
from tests.support.feed_data import SYMBOLS, feed_records, sorted_by_key, write_feed
from tests.support.wait import wait_until_async


async def collect(source: ReplaySource | QueuedSource) -> tuple[np.ndarray, list[HealthEvent], int]:
    batches: list[np.ndarray] = []
    health: list[HealthEvent] = []
    async with source:
        async for event in source:
            if isinstance(event, RecordBatch):
                batches.append(event.records)
            else:
                health.append(event)
    records = np.concatenate(batches) if batches else np.empty(0)
    return records, health, len(batches)


async def test_replay_of_a_file_yields_every_record_in_order(tmp_path: Path) -> None:
    records = feed_records(3000)
    path = write_feed(tmp_path / "feed.dbn.zst", records)
    source = ReplaySource(path, batch_records=1000)
    got, health, batches = await collect(source)
    assert got.tobytes() == records.tobytes()
    assert health == []
    assert batches == 6
    assert source.state is State.STOPPED
    assert source.counters.records == len(records)
    assert source.dataset == "GLBX.MDP3"
    assert source.symbols == SYMBOLS


async def test_replay_of_a_directory_reads_daily_files_in_time_order(tmp_path: Path) -> None:
    records = feed_records(1000, next_day_from=0.5)
    half = len(records) // 2
    write_feed(tmp_path / "b-later.dbn", records[half:])
    write_feed(tmp_path / "a-earlier.dbn.zst", records[:half])
    got, _, _ = await collect(ReplaySource(tmp_path))
    assert got.tobytes() == records.tobytes()


async def test_paced_replay_releases_records_by_ts_recv(tmp_path: Path) -> None:
    records = feed_records(200)  # ~0.4 s of data per instrument
    path = write_feed(tmp_path / "feed.dbn", records)
    span_s = (int(records["ts_recv"][-1]) - int(records["ts_recv"][0])) / 1e9
    source = ReplaySource(path, pace=span_s / 0.3)  # the whole feed over ~0.3 s of wall time
    got, _, batches = await collect(source)
    assert got.tobytes() == records.tobytes()
    assert batches > 1  # released in several due runs, not one chunk


async def test_replay_errors_are_feed_errors_at_start(tmp_path: Path) -> None:
    with pytest.raises(DBNFormatError, match="no such file"):
        await ReplaySource(tmp_path / "missing.dbn").start()
    source = ReplaySource(tmp_path)  # a directory without DBN files
    with pytest.raises(DBNFormatError, match=r"no \.dbn"):
        await source.start()
    assert source.state is State.FAULTED
    with pytest.raises(FeedError, match="pace"):
        ReplaySource(tmp_path, pace=-1)


async def test_a_source_cannot_start_twice_and_stop_is_idempotent(tmp_path: Path) -> None:
    path = write_feed(tmp_path / "feed.dbn", feed_records(10))
    source = ReplaySource(path)
    await source.start()
    with pytest.raises(FeedError, match="cannot start"):
        await source.start()
    await source.stop()
    await source.stop()
    assert source.state is State.STOPPED
    assert await source.next() is None


class _PushSource(QueuedSource):
    """A queued source fed by the test (what NATS callbacks and live threads do)."""

    async def _start(self) -> None:
        return None

    async def _stop(self) -> None:
        return None


async def test_queued_source_drops_batches_when_full_and_reports_once() -> None:
    source = _PushSource("push", max_batches=2, stale_after_s=60)
    await source.start()
    records = feed_records(6)
    assert source._emit_records(records[:2])
    assert source._emit_records(records[2:4])
    assert not source._emit_records(records[4:7])  # full: dropped
    assert not source._emit_records(records[7:10])
    events = [event for event in (await source.next(), await source.next()) if event is not None]
    assert source._emit_records(records[10:11])  # room again: the drop episode is reported first
    source._finish()
    events += [event async for event in source]
    kinds = [type(e).__name__ if isinstance(e, RecordBatch) else e.kind for e in events]
    assert kinds == ["RecordBatch", "RecordBatch", HealthKind.DROPPED, "RecordBatch"]
    dropped = events[2]
    assert isinstance(dropped, HealthEvent)
    assert dropped.count == 6
    assert source.counters.dropped_records == 6
    await source.stop()


async def test_queued_source_reports_a_stale_feed_once_per_episode() -> None:
    source = _PushSource("push", max_batches=4, stale_after_s=0.05)
    await source.start()
    stale = await source.next()
    assert isinstance(stale, HealthEvent)
    assert stale.kind is HealthKind.STALE
    source._emit_records(feed_records(1))
    source._finish()
    rest = [event async for event in source]
    assert [type(e) for e in rest] == [RecordBatch]
    assert source.counters.stale == 1
    await source.stop()


async def test_queued_source_raises_the_producer_error_as_feed_error() -> None:
    source = _PushSource("push", max_batches=4, stale_after_s=60)
    await source.start()
    source._finish(FeedError("session lost"))
    with pytest.raises(FeedError, match="session lost"):
        await source.next()
    assert source.state is State.FAULTED
    await source.stop()


async def test_queued_source_hands_over_every_ready_event_at_once_and_the_end_after_them() -> None:
    source = _PushSource("push", max_batches=8, stale_after_s=60)
    await source.start()
    records = feed_records(3)
    source._emit_records(records[:2])
    source._emit_health(HealthEvent(HealthKind.GAP, 1))
    source._emit_records(records[2:])
    source._finish(FeedError("session lost"))
    ready = await source.next_events()
    assert [type(e).__name__ if isinstance(e, RecordBatch) else e.kind for e in ready] == [
        "RecordBatch",
        HealthKind.GAP,
        "RecordBatch",
    ]
    assert source._queued_batches == 0
    with pytest.raises(FeedError, match="session lost"):
        await source.next_events()
    await source.stop()
    assert await source.next_events() == []


async def test_queued_source_tells_as_it_queues_and_hands_over_what_is_queued_without_waiting() -> None:
    source = _PushSource("push", max_batches=2, stale_after_s=60)
    await source.start()
    told: list[int] = []
    source.notify(lambda: told.append(len(source._items)))  # called with the event already queued
    records = feed_records(3)
    assert source.take_ready() == []
    source._emit_records(records[:2])
    source._emit_health(HealthEvent(HealthKind.GAP, 1))
    assert told == [1, 2]
    taken = source.take_ready()
    assert [type(e).__name__ if isinstance(e, RecordBatch) else e.kind for e in taken] == [
        "RecordBatch",
        HealthKind.GAP,
    ]
    assert source._queued_batches == 0  # room for two batches again: neither is dropped
    assert source._emit_records(records[2:4]) and source._emit_records(records[4:])
    source.notify(None)
    source._finish(FeedError("session lost"))
    assert told == [1, 2, 1, 2]
    assert len(source.take_ready()) == 2
    assert source.take_ready() == []  # the end stays for next(), which raises it
    with pytest.raises(FeedError, match="session lost"):
        await source.next()
    await source.stop()


async def test_thread_bridge_batches_records_from_another_thread_and_counts_drops() -> None:
    loop = asyncio.get_running_loop()
    drained: list[tuple[bytes, int, int]] = []
    bridge = ThreadBridge(
        loop, lambda raw, n, dropped: drained.append((raw, n, dropped)), max_pending_records=50
    )
    records = feed_records(50)  # 100 records

    def produce() -> None:
        for record in records:
            bridge.put(record.tobytes())

    thread = threading.Thread(target=produce)
    thread.start()
    # Every record is delivered or counted as dropped.
    await wait_until_async(
        lambda: sum(n + d for _, n, d in drained) == len(records), 10, "every record drained or dropped"
    )
    thread.join()
    received = sum(n for _, n, _ in drained)
    raw = b"".join(r for r, _, _ in drained)
    decoded = StreamDecoder(framing="message").feed(raw)
    assert len(decoded) == received
    originals = {record.tobytes(): i for i, record in enumerate(records)}
    positions = [originals[record.tobytes()] for record in decoded]
    assert positions == sorted(positions)  # a subsequence of what was produced, in order


def test_subject_layout_normalises_tokens() -> None:
    assert subject_token("GLBX.MDP3") == "GLBX-MDP3"
    assert subject_for("GLBX.MDP3", "ESZ6") == "md.mbp10.GLBX-MDP3.ESZ6"
    assert subject_for("OPRA.PILLAR", "SPY 250117C00500000") == "md.mbp10.OPRA-PILLAR.SPY_250117C00500000"
    assert dataset_subjects("GLBX.MDP3") == ["md.mbp10.GLBX-MDP3.>"]
    assert dataset_subjects("GLBX.MDP3", ("ES", "NQ")) == ["md.mbp10.GLBX-MDP3.ES", "md.mbp10.GLBX-MDP3.NQ"]
    for bad in ("", "ES*", "NQ>", "A\tB"):
        with pytest.raises(FeedError):
            subject_token(bad)


def test_encoder_splits_by_instrument_and_size_and_tags_every_piece() -> None:
    records = feed_records(700)
    encoder = MessageEncoder("GLBX.MDP3", batch_records=300)
    messages, unknown = encoder.encode(records, {1001: "ES"})  # NQ has no symbol
    assert len(unknown) == 700
    assert set(unknown["instrument_id"].tolist()) == {1002}
    assert [m.records for m in messages] == [300, 300, 100]
    assert {m.subject for m in messages} == {"md.mbp10.GLBX-MDP3.ES"}
    tags = [parse_tags(m.headers) for m in messages]
    assert [t.seq for t in tags] == [1, 2, 3]
    assert all(t.part is not None and t.part.batch == 1 and t.part.parts == 3 for t in tags)
    decoder = StreamDecoder(framing="message")
    es = np.concatenate([decoder.feed(m.payload) for m in messages])
    assert es.tobytes() == records[records["instrument_id"] == 1001].tobytes()
    more, _ = encoder.encode(records, SYMBOLS)
    assert {parse_tags(m.headers).part.batch for m in more} == {2}  # type: ignore[union-attr]
    merged = sorted_by_key(np.concatenate([decoder.feed(m.payload) for m in more]))
    assert merged.tobytes() == sorted_by_key(records).tobytes()


def test_sequence_tracker_measures_gaps_and_repeats() -> None:
    tracker = SequenceTracker()
    subject = "md.mbp10.GLBX-MDP3.ES"
    assert tracker.observe(subject, WireTags("r1", 1, None)) == (0, False)
    assert tracker.observe(subject, WireTags("r1", 2, None)) == (0, False)
    assert tracker.observe(subject, WireTags("r1", 5, None)) == (2, False)
    assert tracker.observe(subject, WireTags("r1", 5, None)) == (0, True)
    assert tracker.observe(subject, WireTags("r2", 1, None)) == (0, False)  # a new relay run
    assert tracker.observe(subject, WireTags(None, None, None)) == (0, False)
    assert parse_tags({"Md-Seq": "x", "Md-Batch": "3/zero"}) == WireTags(None, None, None)


def test_payloads_received_together_are_checked_as_one_buffer_and_bad_ones_left_to_the_decoder() -> None:
    records = feed_records(6)
    wrong_rtype = records[:1].copy()
    wrong_rtype["rtype"] = 0x77
    payloads = [
        records[:3].tobytes(),
        b"",
        b"not DBN",
        records[3:5].tobytes() + wrong_rtype.tobytes(),
        records[5:].tobytes(),
    ]
    got = whole_records(payloads)
    assert [g is None for g in got] == [False, True, True, True, False]
    assert got[0] is not None and got[0].tobytes() == payloads[0]
    assert got[4] is not None and got[4].tobytes() == payloads[4]
    assert whole_records([b"x" * 7]) == [None]


def test_stream_sequence_reads_both_forms_of_the_acknowledgement_subject() -> None:
    assert stream_sequence("$JS.ACK.MBP10.daemon.1.42.7.1700000000000000000.3") == 42
    assert stream_sequence("$JS.ACK.hub.ACCOUNT.MBP10.daemon.2.43.8.1700000000000000000.0.tok") == 43
    assert stream_sequence("$JS.ACK._.ACCOUNT.MBP10.daemon.2.44.8.1700000000000000000.0") == 44
    for reply in (None, "", "_INBOX.abc", "$JS.ACK.MBP10.daemon", "$JS.ACK.MBP10.d.1.x.7.1700.3"):
        assert stream_sequence(reply) is None


def test_read_back_helper_agrees_with_the_writer(tmp_path: Path) -> None:
    records = feed_records(100)
    assert read_mbp10(write_feed(tmp_path / "f.dbn", records)).tobytes() == records.tobytes()


_FUZZ_BASE = feed_records(3)[:4].tobytes()  # four real MBP-10 records (ES, NQ interleaved)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cut=st.integers(0, len(_FUZZ_BASE)),
    flips=st.lists(st.tuples(st.integers(0, len(_FUZZ_BASE) - 1), st.integers(0, 255)), max_size=8),
    junk=st.binary(max_size=64),
)
def test_nats_message_boundary_never_raises_and_counts_every_bad_message(
    cut: int, flips: list[tuple[int, int]], junk: bytes
) -> None:
    data = bytearray(_FUZZ_BASE)
    for index, value in flips:
        data[index] = value
    payload = bytes(data[:cut]) + junk
    source = NatsSource(url="nats://127.0.0.1:1", dataset="GLBX.MDP3")  # never started: no I/O
    # Received together with a good message on either side (one transport read).
    subject, headers = "md.mbp10.GLBX-MDP3.ES", {"Md-Seq": "x", "Md-Batch": junk.hex()}
    before, after = _FUZZ_BASE[:MBP10_SIZE], _FUZZ_BASE[MBP10_SIZE:]
    source._arrived = [
        Msg(None, subject=subject, reply=f"$JS.ACK.MBP10.d.1.{seq}.{seq}.1.0", data=body, headers=headers)  # type: ignore[arg-type]
        for seq, body in ((1, before), (2, payload), (3, after))
    ]
    source._take_arrived()
    counters = source.counters
    assert counters.messages == 3
    queued = [item for item in source._items if isinstance(item, RecordBatch)]
    assert counters.rejected_messages + len(queued) <= 3
    assert queued[0].records.tobytes() == before
    assert queued[-1].records.tobytes() == after
    assert [b.transport_seq for b in queued] in ([1, 3], [1, 2, 3])
    if counters.rejected_messages:
        assert counters.rejected_bytes == len(payload)
        assert [e.kind for e in source._items if isinstance(e, HealthEvent)] == [HealthKind.REJECTED]
    for batch in queued:  # whatever passed is well-framed MBP-10, never garbage
        assert (batch.records["length"] == 92).all()
        assert (batch.records["rtype"] == 0x0A).all()


def test_the_public_surface_of_feeds_sources_is_pinned() -> None:
    assert sorted(feeds.sources.__all__) == [
        "DatabentoLiveSource",
        "HealthEvent",
        "HealthKind",
        "NatsSource",
        "QueuedSource",
        "RecordBatch",
        "ReplaySource",
        "Source",
        "SourceCounters",
        "SourceEvent",
        "build_source",
        "config_symbols",
        "dataset_subjects",
        "load_api_key",
        "subject_for",
        "subject_token",
    ]
    assert all(hasattr(feeds.sources, name) for name in feeds.sources.__all__)
