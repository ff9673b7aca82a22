"""DBN I/O: files written and read with Databento's libraries, the recorder's appending writer
(killed for real with SIGKILL), and the stream decoder's framing."""

from __future__ import annotations

import datetime as dt
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import databento
import numpy as np
import numpy.typing as npt
import pytest
import zstandard

import feeds.dbn
from feeds.config import InstrumentSpec, SynthConfig
from feeds.dbn import (
    DBNAppender,
    StreamDecoder,
    dbn_files,
    iter_mbp10,
    read_mbp10,
    read_metadata,
    record_bytes,
    record_messages,
    write_mbp10,
)
from feeds.dbn.framing import concat_mbp10
from feeds.dbn.reader import read_ahead
from feeds.errors import DBNFormatError, UnknownInstrument
from feeds.records import MBP10_DTYPE
from feeds.synth import session_bounds, simulate_session
from tests.conftest import DBN_SAMPLES, REPO

DAY = dt.date(2024, 3, 4)
ES = InstrumentSpec(symbol="ES", instrument_id=1001, session_start="14:00", session_end="14:10")
SYMBOLS = {1001: "ES"}


@pytest.fixture(scope="module")
def records() -> npt.NDArray[np.void]:
    """Ten minutes of synthetic ES (~4k records)."""
    return simulate_session(ES, DAY, SynthConfig(), seed=7, open_tick=20_000).records


def _write(path: Path, recs: npt.NDArray[np.void], day: dt.date = DAY) -> Path:
    start, end = session_bounds(ES, day)
    return write_mbp10(path, recs, dataset="SYNTH", symbols=SYMBOLS, start_ns=start, end_ns=end)


@pytest.mark.parametrize("name", ["a.dbn", "a.dbn.zst"])
def test_write_then_read_round_trip_with_databento(
    tmp_path: Path, records: npt.NDArray[np.void], name: str
) -> None:
    path = _write(tmp_path / name, records)
    assert np.array_equal(read_mbp10(path), records)
    store = databento.DBNStore.from_bytes(path.read_bytes())
    assert str(store.compression) == ("zstd" if name.endswith("zst") else "none")
    assert str(store.schema) == "mbp-10"
    assert store.metadata.version == 3
    assert store.dataset == "SYNTH"
    assert store.symbology["mappings"]["ES"][0]["symbol"] == "1001"
    assert np.array_equal(np.asarray(store.to_ndarray()), records)
    info = read_metadata(path)
    assert (info.symbols, info.dataset, info.schema) == (SYMBOLS, "SYNTH", "mbp-10")
    assert (info.start_ns, info.end_ns) == session_bounds(ES, DAY)
    assert not list(tmp_path.glob(".*")), "temporary file left behind"


def test_plain_and_compressed_files_give_the_same_chunks(
    tmp_path: Path, records: npt.NDArray[np.void]
) -> None:
    # a plain file is memory-mapped, a compressed one goes through Databento's reader
    plain = _write(tmp_path / "a.dbn", records)
    packed = _write(tmp_path / "a.dbn.zst", records)
    for chunk_records in (1, 7, len(records), len(records) + 1):
        mapped = list(iter_mbp10(plain, chunk_records=chunk_records))
        decoded = list(iter_mbp10(packed, chunk_records=chunk_records))
        assert [len(c) for c in mapped] == [len(c) for c in decoded]
        assert all(a.tobytes() == b.tobytes() for a, b in zip(mapped, decoded, strict=True))
        assert not any(c.flags.writeable for c in mapped)
        # both under the project's dtype object itself (an equal copy compares field by field)
        assert all(c.dtype is MBP10_DTYPE for c in mapped + decoded)
    assert np.array_equal(np.concatenate(mapped), records)


def test_reading_ahead_gives_the_same_chunks_and_errors(
    tmp_path: Path, records: npt.NDArray[np.void]
) -> None:
    """``ahead`` decodes on a background thread: the same chunks in the same order, a corrupt
    file's error raised after the same good chunks, and a consumer that stops early stops the
    thread (the file's reader closed with it)."""
    later = records.copy()
    later["ts_recv"] += np.uint64(86_400 * 10**9)
    _write(tmp_path / "a.dbn.zst", records)
    _write(tmp_path / "b.dbn.zst", later, DAY + dt.timedelta(days=1))
    for ahead in (1, 3):
        plain = list(iter_mbp10(tmp_path, chunk_records=333))
        read = list(iter_mbp10(tmp_path, chunk_records=333, ahead=ahead))
        assert [c.tobytes() for c in read] == [c.tobytes() for c in plain]
    threads = threading.active_count()
    chunks = iter_mbp10(tmp_path, chunk_records=100, ahead=2)
    assert len(next(chunks)) == 100
    chunks.close()
    assert threading.active_count() == threads
    path = tmp_path / "b.dbn.zst"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # the second file ends inside its data
    for ahead in (0, 2):
        got = []
        with pytest.raises(DBNFormatError, match=r"b\.dbn\.zst"):
            for chunk in iter_mbp10(tmp_path, chunk_records=500, ahead=ahead):
                got.append(len(chunk))
        assert sum(got) >= len(records)  # every chunk before the damage came first
        if ahead == 0:
            before = got
    assert got == before


def test_read_ahead_stops_its_source_when_the_consumer_stops() -> None:
    closed = []

    def source() -> Iterator[int]:
        try:
            yield from range(1_000)
        finally:
            closed.append(True)

    items = read_ahead(source(), 2)
    assert [next(items) for _ in range(5)] == list(range(5))
    items.close()
    assert closed == [True]
    with pytest.raises(ZeroDivisionError):
        list(read_ahead((1 // x for x in (1, 1, 0, 1)), 1))


def test_writing_is_deterministic(tmp_path: Path, records: npt.NDArray[np.void]) -> None:
    a = _write(tmp_path / "a.dbn.zst", records)
    b = _write(tmp_path / "b.dbn.zst", records)
    assert a.read_bytes() == b.read_bytes()


def test_directory_is_read_in_time_order(tmp_path: Path, records: npt.NDArray[np.void]) -> None:
    later = records.copy()
    later["ts_recv"] += np.uint64(86_400 * 10**9)
    # Names sort opposite to time: the reader orders by metadata start.
    _write(tmp_path / "a-later.dbn.zst", later, DAY + dt.timedelta(days=1))
    _write(tmp_path / "b-earlier.dbn", records)
    (tmp_path / "notes.txt").write_text("not DBN")
    expected = concat_mbp10([records, later])
    assert np.array_equal(read_mbp10(tmp_path), expected)
    chunks = list(iter_mbp10(tmp_path, chunk_records=1000))
    assert max(len(c) for c in chunks) <= 1000
    assert np.array_equal(concat_mbp10(chunks), expected)
    start, middle = int(records["ts_recv"][50]), int(later["ts_recv"][100])
    ts = expected["ts_recv"].astype(np.int64)
    window = read_mbp10(tmp_path, start_ns=start, end_ns=middle)
    assert 0 < len(window) < len(expected)
    assert np.array_equal(window, expected[(ts >= start) & (ts < middle)])
    assert np.array_equal(concat_mbp10(list(iter_mbp10(tmp_path, start_ns=middle))), expected[ts >= middle])


def test_read_merges_files_that_overlap_in_time(tmp_path: Path, records: npt.NDArray[np.void]) -> None:
    other = records.copy()
    other["instrument_id"] = 1002
    _write(tmp_path / "es.dbn", records)
    write_mbp10(tmp_path / "nq.dbn", other, dataset="SYNTH", symbols={1002: "NQ"}, start_ns=0, end_ns=None)
    merged = read_mbp10(tmp_path)
    assert len(merged) == 2 * len(records)
    assert np.all(np.diff(merged["ts_recv"].astype(np.int64)) >= 0)
    with pytest.raises(DBNFormatError, match="overlaps"):
        list(iter_mbp10(tmp_path))


def test_bad_paths_and_files_name_the_file(tmp_path: Path, records: npt.NDArray[np.void]) -> None:
    with pytest.raises(DBNFormatError, match="no such file"):
        read_mbp10(tmp_path / "missing.dbn")
    with pytest.raises(DBNFormatError, match=r"holds no \.dbn"):
        read_mbp10(tmp_path)
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(DBNFormatError, match=r"holds no \.dbn"):
        dbn_files(tmp_path)
    raw = _write(tmp_path / "ok.dbn", records).read_bytes()
    cases = {
        "empty.dbn": b"",
        "garbage.dbn": b"\x00garbage" * 100,
        "truncated.dbn": raw[: len(raw) - 100],
        "cut-metadata.dbn": raw[:40],
        "truncated.dbn.zst": zstandard.ZstdCompressor().compress(raw)[:-50],
    }
    for name, data in cases.items():
        path = tmp_path / "bad" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        with pytest.raises(DBNFormatError, match=name.replace(".", r"\.")):
            read_mbp10(path)
        with pytest.raises(DBNFormatError, match=name.replace(".", r"\.")):
            list(iter_mbp10(path))
        path.unlink()
    wrong_rtype = bytearray(raw)
    wrong_rtype[len(raw) - 368 + 1] = 0x01  # last record claims to be MBP-1
    bad = tmp_path / "bad" / "rtype.dbn"
    bad.write_bytes(bytes(wrong_rtype))
    with pytest.raises(DBNFormatError, match=r"rtype\.dbn.*not MBP-10.*rtype 0x01"):
        read_mbp10(bad)


def test_a_file_that_is_not_dbn_leaves_no_file_open(tmp_path: Path) -> None:
    """``DBNStore`` opens the file before it sniffs the format and leaves it to the garbage
    collector when the format is unknown: the reader must close it (a ResourceWarning otherwise)."""
    path = tmp_path / "not-dbn.dbn"
    path.write_bytes(b"PK\x03\x04 a zip, not DBN " * 10)
    open_fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = open_fds()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for read in (read_mbp10, read_metadata, lambda p: list(iter_mbp10(p))):
            with pytest.raises(DBNFormatError, match=r"not-dbn\.dbn: not a readable DBN file"):
                read(path)
        assert open_fds() == before
        gc.collect()
    assert [w.message for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_writer_refuses_bad_records(tmp_path: Path, records: npt.NDArray[np.void]) -> None:
    with pytest.raises(DBNFormatError, match="ts_recv order"):
        _write(tmp_path / "a.dbn", records[::-1].copy())
    with pytest.raises(UnknownInstrument, match="instrument id 1001"):
        write_mbp10(tmp_path / "b.dbn", records, dataset="SYNTH", symbols={7: "X"}, start_ns=0, end_ns=None)
    with pytest.raises(DBNFormatError, match="MBP10_DTYPE"):
        _write(tmp_path / "c.dbn", np.zeros(3, dtype=np.int64))
    with pytest.raises(DBNFormatError, match="record 0 is not MBP-10"):
        _write(tmp_path / "d.dbn", np.zeros(3, dtype=MBP10_DTYPE))
    with pytest.raises(DBNFormatError, match="dataset"):
        write_mbp10(tmp_path / "e.dbn", records, dataset="", symbols=SYMBOLS, start_ns=0, end_ns=None)
    assert not list(tmp_path.iterdir())


def test_appender_flushes_frames_and_resumes_after_a_torn_tail(
    tmp_path: Path, records: npt.NDArray[np.void]
) -> None:
    path = tmp_path / "rec.dbn.zst"
    start, _ = session_bounds(ES, DAY)
    parts = np.array_split(records, 4)
    with DBNAppender(path, dataset="SYNTH", symbols=SYMBOLS, start_ns=start) as out:
        out.append(parts[0])
        out.flush()
        assert np.array_equal(read_mbp10(path), parts[0])  # readable while still open
        out.append(parts[1])
        assert out.pending_records == len(parts[1])
    assert np.array_equal(read_mbp10(path), concat_mbp10(parts[:2]))
    assert read_metadata(path).end_ns is None
    with path.open("ab") as f:  # a frame torn by a crash in the middle of a write
        f.write(zstandard.ZstdCompressor().compress(record_bytes(parts[2]))[:-30])
    with pytest.raises(DBNFormatError, match=r"rec\.dbn\.zst"):
        read_mbp10(path)
    with DBNAppender(path, dataset="SYNTH", symbols=SYMBOLS, start_ns=start) as out:
        assert out.records_flushed == len(parts[0]) + len(parts[1])
        with pytest.raises(DBNFormatError, match="ts_recv order"):
            out.append(parts[0])
        with pytest.raises(UnknownInstrument):
            bad = parts[2].copy()
            bad["instrument_id"] = 5
            out.append(bad)
        out.append(parts[2])
        out.append(parts[3])
    assert np.array_equal(read_mbp10(path), records)
    with pytest.raises(DBNFormatError, match="different metadata"):
        DBNAppender(path, dataset="OTHER", symbols=SYMBOLS, start_ns=start).open()


@pytest.mark.parametrize("suffix", [".dbn", ".dbn.zst"])
def test_appender_knows_its_last_ts_recv_the_records_at_it_and_its_last_frame(
    tmp_path: Path, records: npt.NDArray[np.void], suffix: str
) -> None:
    path = tmp_path / f"rec{suffix}"
    tied = records[:12].copy()
    tied["ts_recv"][-4:] = tied["ts_recv"][-4]  # the last four share one ts_recv, over two frames
    with DBNAppender(path, dataset="SYNTH", symbols=SYMBOLS, start_ns=0) as out:
        assert out.last_ts_recv == 0 and len(out.records_at_last_ts()) == 0
        out.append(tied[:10])
        out.flush()
        assert np.array_equal(out.last_frame_records(), tied[:10])
        out.append(tied[10:])
        assert out.last_ts_recv == int(tied["ts_recv"][-1])
        assert np.array_equal(out.records_at_last_ts(), tied[-4:])
    with DBNAppender(path, dataset="SYNTH", symbols=SYMBOLS, start_ns=0) as out:  # found in the file
        assert out.records_flushed == 12
        assert out.last_ts_recv == int(tied["ts_recv"][-1])
        assert np.array_equal(out.records_at_last_ts(), tied[-4:])
        # zstd: the last frame (the second flush); plain: the one slice the file fits in
        assert np.array_equal(out.last_frame_records(), tied[10:] if suffix == ".dbn.zst" else tied)
        out.append(records[12:14])
        assert out.last_ts_recv == int(records["ts_recv"][13])


def test_plain_appender_cuts_a_partial_record(tmp_path: Path, records: npt.NDArray[np.void]) -> None:
    path = tmp_path / "rec.dbn"
    with DBNAppender(path, dataset="SYNTH", symbols=SYMBOLS, start_ns=0) as out:
        out.append(records[:10])
    with path.open("ab") as f:
        f.write(record_bytes(records[10:11])[:100])
    with DBNAppender(path, dataset="SYNTH", symbols=SYMBOLS, start_ns=0) as out:
        assert out.records_flushed == 10
        out.append(records[10:20])
    assert np.array_equal(read_mbp10(path), records[:20])


WRITER = textwrap.dedent(
    """
    import signal, sys
    import numpy as np
    from feeds.dbn import DBNAppender, read_mbp10
    records = read_mbp10(sys.argv[2])
    with DBNAppender(sys.argv[1], dataset="SYNTH", symbols={1001: "ES"}, start_ns=0) as out:
        out.append(records[:1500])
        out.flush()
        out.append(records[1500:])
        print("flushed", flush=True)
        signal.pause()  # until the kill
    """
)


def test_a_writer_killed_after_flush_leaves_a_readable_file(
    tmp_path: Path, records: npt.NDArray[np.void]
) -> None:
    source = _write(tmp_path / "source.dbn", records)
    path = tmp_path / "killed.dbn.zst"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(source)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "flushed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert np.array_equal(read_mbp10(path), records[:1500])


def test_stream_decoder_messages_batches_and_ts_out(records: npt.NDArray[np.void]) -> None:
    messages = record_messages(records[:50])
    assert all(len(m) == 368 for m in messages)
    decoder = StreamDecoder(framing="message")
    assert np.array_equal(concat_mbp10([decoder.feed(m) for m in messages]), records[:50])
    assert np.array_equal(decoder.feed(record_bytes(records[50:90])), records[50:90])
    assert decoder.counters.records == 90 and decoder.counters.rejected_chunks == 0
    # A message that ends inside a record is rejected whole; the next one decodes.
    assert len(decoder.feed(record_bytes(records[:3])[:-1])) == 0
    assert decoder.counters.rejected_chunks == 1 and "stray bytes" in (decoder.last_error or "")
    assert np.array_equal(decoder.feed(messages[0]), records[:1])
    # ts_out: 8 more bytes per record, length byte 94; stripped on output.
    rows = np.frombuffer(record_bytes(records[:5]), np.uint8).reshape(5, 368)
    wide = np.concatenate([rows, np.zeros((5, 8), np.uint8)], axis=1)
    wide[:, 0] = 94
    out = StreamDecoder(ts_out=True).feed(wide.tobytes())
    assert np.array_equal(out, records[:5])


def test_stream_decoder_counts_other_records_in_a_mixed_stream(records: npt.NDArray[np.void]) -> None:
    trades = databento.DBNStore.from_bytes((DBN_SAMPLES / "test_data.trades.dbn").read_bytes())
    trade_bytes = np.asarray(trades.to_ndarray()).tobytes()  # two v2 TradeMsg records (48 bytes each)
    stream = record_bytes(records[:3]) + trade_bytes + record_bytes(records[3:6])
    decoder = StreamDecoder(input_version=2)
    got = concat_mbp10([decoder.feed(stream[i : i + 100]) for i in range(0, len(stream), 100)])
    assert np.array_equal(got, records[:6])
    assert decoder.counters.other_records == {0: 2}
    assert decoder.counters.rejected_chunks == 0


def test_stream_decoder_rejects_and_recovers(records: npt.NDArray[np.void]) -> None:
    decoder = StreamDecoder()
    good = record_bytes(records[:4])
    assert len(decoder.feed(good[:500])) == 1  # one record complete, the rest held back
    corrupt = bytearray(good[500:])
    corrupt[368 * 2 - 500] = 7  # the third record's length byte
    assert len(decoder.feed(bytes(corrupt))) == 0  # nothing of the bad chunk comes out
    assert decoder.counters.rejected_chunks == 1 and decoder.buffered == 0
    assert "length" in (decoder.last_error or "")
    assert np.array_equal(decoder.feed(record_bytes(records[4:8])), records[4:8])
    assert len(decoder.feed(b"\x5c\x77" + b"\x00" * 366)) == 0
    assert "unknown rtype 0x77" in (decoder.last_error or "")
    assert decoder.counters.rejected_chunks == 2
    with_metadata = StreamDecoder(has_metadata=True)
    assert len(with_metadata.feed(b"NOT DBN AT ALL")) == 0
    assert with_metadata.counters.rejected_chunks == 1 and with_metadata.metadata is None


def test_public_surface_is_pinned() -> None:
    assert sorted(feeds.dbn.__all__) == [
        "DBNAppender",
        "DBNInfo",
        "StreamCounters",
        "StreamDecoder",
        "build_metadata",
        "dbn_files",
        "iter_mbp10",
        "read_mbp10",
        "read_metadata",
        "record_bytes",
        "record_messages",
        "write_mbp10",
    ]
    assert all(hasattr(feeds.dbn, name) for name in feeds.dbn.__all__)
