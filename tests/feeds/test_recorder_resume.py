"""The recorder's restart logic without a transport: an archive left by a recorder killed at
a day boundary (the finished day's file complete, the new day's file created but still empty,
the finished day's messages not yet acknowledged) must be completed without duplicates when
those messages are redelivered."""

from __future__ import annotations

from pathlib import Path

import databento
import numpy as np

from agent.config import load_config
from feeds.dbn import DBNAppender
from feeds.recorder import NS_PER_DAY, Recorder, archive_path, day_start_ns
from feeds.sources.events import RecordBatch
from tests.support.feed_data import DATASET, SYMBOLS, feed_records, sorted_by_key


def batches(records: np.ndarray, size: int, first_seq: int) -> list[RecordBatch]:
    return [
        RecordBatch(records[i : i + size], received_ns=0, transport_seq=first_seq + i // size)
        for i in range(0, len(records), size)
    ]


def archive_left_by_a_kill_at_the_day_boundary(tmp_path: Path) -> tuple[np.ndarray, int, Path]:
    """(the feed, index of its first record of the second day, the archive): the first day's
    file holds the records before that index, the second day's file exists but is empty."""
    records = feed_records(500, next_day_from=0.5)
    first_day = day_start_ns(int(records["ts_recv"][0]), 0)
    split = int(np.searchsorted(records["ts_recv"], np.uint64(first_day + NS_PER_DAY)))
    assert 0 < split < len(records)
    out = tmp_path / "archive"
    for day, part in ((first_day, records[:split]), (first_day + NS_PER_DAY, records[:0])):
        with DBNAppender(
            archive_path(out, DATASET, day),
            dataset=DATASET,
            symbols=SYMBOLS,
            start_ns=day,
            end_ns=day + NS_PER_DAY,
        ) as writer:
            writer.append(part)
    return records, split, out


def resumed_recorder_takes(out: Path, taken: list[RecordBatch]) -> Recorder:
    """A recorder restarted on the archive ``out`` that takes ``taken`` and closes its day."""
    recorder = Recorder(load_config(env={}).feeds, out)
    recorder._resume_floor()
    for batch in taken:
        recorder._take(batch)
    recorder._close_writer(completed=True)
    return recorder


def read_back(out: Path) -> np.ndarray:
    written = []
    for path in sorted(out.glob("*.dbn.zst")):
        data = np.asarray(databento.DBNStore.from_bytes(path.read_bytes()).to_ndarray()).reshape(-1)
        assert np.all(np.diff(data["ts_recv"].astype(np.int64)) >= 0), path.name
        written.append(data)
    return np.concatenate(written)


def test_redelivered_messages_of_a_completed_day_are_duplicates_when_the_new_day_file_is_empty(
    tmp_path: Path,
) -> None:
    records, split, out = archive_left_by_a_kill_at_the_day_boundary(tmp_path)
    # Redelivery starts inside the completed day: its last five messages (whole publisher
    # batches, written but never acknowledged) come again before the new day's.
    redelivered = batches(records[split - 320 : split], 64, first_seq=1)
    recorder = resumed_recorder_takes(
        out, [*redelivered, *batches(records[split:], 64, first_seq=len(redelivered) + 1)]
    )

    assert recorder.counters.duplicate_records == 320
    assert recorder.counters.out_of_order == 0
    assert sorted_by_key(read_back(out)).tobytes() == sorted_by_key(records).tobytes()


def test_a_batch_cut_by_the_day_boundary_is_completed_once(tmp_path: Path) -> None:
    """The kill came after the batch spanning midnight was appended to both files and the
    finished day's file was closed (flushed), before the new day's file was flushed: its first
    part is durable, the rest is not, and none of it was acknowledged."""
    records, split, out = archive_left_by_a_kill_at_the_day_boundary(tmp_path)
    spanning = RecordBatch(records[split - 100 : split + 100], received_ns=0, transport_seq=1)
    recorder = resumed_recorder_takes(out, [spanning, *batches(records[split + 100 :], 64, first_seq=2)])

    assert recorder.counters.duplicate_records == 100
    assert recorder.counters.out_of_order == 0
    assert sorted_by_key(read_back(out)).tobytes() == sorted_by_key(records).tobytes()


def test_records_below_the_floor_that_were_never_written_are_out_of_order(tmp_path: Path) -> None:
    """A publisher that breaks ts_recv order: records below the floor that are not in the
    archive are counted and skipped, never written out of order."""
    records, split, out = archive_left_by_a_kill_at_the_day_boundary(tmp_path)
    late = records[split - 10 : split + 10].copy()
    late["ts_recv"][:10] -= np.uint64(1)  # not the bytes the archive holds
    recorder = resumed_recorder_takes(out, [RecordBatch(late, received_ns=0, transport_seq=1)])

    assert recorder.counters.out_of_order == 10
    assert recorder.counters.duplicate_records == 0
    assert len(read_back(out)) == split + 10
