"""Conformance with Databento's official DBN samples (DBN versions 1-3, plain and zstd).

Our feed code must agree with ``databento.DBNStore`` on every field of every MBP-10 record.
The reference side iterates DBNStore's *record objects* (decoded by databento_dbn), an
independent path from the ``to_ndarray`` views our reader uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import databento
import numpy as np
import numpy.typing as npt
import pytest
import zstandard

from feeds.dbn import StreamDecoder, iter_mbp10, read_mbp10, read_metadata, record_bytes
from feeds.dbn.framing import concat_mbp10
from feeds.errors import DBNFormatError
from feeds.records import LEVELS, MBP10_DTYPE
from tests.conftest import DBN_SAMPLES

MBP10_SAMPLES = sorted(DBN_SAMPLES.glob("test_data.mbp-10*.dbn*"))
OTHER_SAMPLES = [DBN_SAMPLES / f"test_data.{schema}.dbn" for schema in ("trades", "mbp-1", "definition")]
HEADER_FIELDS = ("publisher_id", "instrument_id", "ts_event", "price", "size", "flags", "depth")
BODY_FIELDS = ("ts_recv", "ts_in_delta", "sequence")
LEVEL_FIELDS = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")


def test_the_samples_are_all_there() -> None:
    assert len(MBP10_SAMPLES) == 4  # current (v2) plain, v1/v2/v3 zstd
    assert all(path.is_file() for path in OTHER_SAMPLES)


def _reference(path: Path) -> list[Any]:
    return list(databento.DBNStore.from_bytes(path.read_bytes()))


def _assert_same(ours: npt.NDArray[np.void], reference: list[Any]) -> None:
    assert ours.dtype == MBP10_DTYPE
    assert len(ours) == len(reference) > 0
    for row, rec in zip(ours, reference, strict=True):
        assert int(row["length"]) * 4 == rec.record_size()
        assert int(row["rtype"]) == rec.rtype.value
        for name in HEADER_FIELDS + BODY_FIELDS:
            assert int(row[name]) == int(getattr(rec, name)), name
        assert row["action"].decode() == rec.action.value
        assert row["side"].decode() == rec.side.value
        assert len(rec.levels) == LEVELS
        for i, level in enumerate(rec.levels):
            for name in LEVEL_FIELDS:
                assert int(row[f"{name}_{i:02d}"]) == int(getattr(level, name)), f"{name}_{i:02d}"


@pytest.mark.parametrize("path", MBP10_SAMPLES, ids=lambda p: p.name)
def test_reader_agrees_with_dbnstore_field_by_field(path: Path) -> None:
    reference = _reference(path)
    _assert_same(read_mbp10(path), reference)
    _assert_same(np.concatenate(list(iter_mbp10(path, chunk_records=1))), reference)


@pytest.mark.parametrize("path", MBP10_SAMPLES, ids=lambda p: p.name)
def test_metadata_and_symbology(path: Path) -> None:
    info = read_metadata(path)
    store = databento.DBNStore.from_bytes(path.read_bytes())
    assert info.dataset == "GLBX.MDP3" == store.dataset
    assert info.schema == "mbp-10"
    assert info.version == store.metadata.version
    assert info.start_ns == store.metadata.start
    assert info.symbols == {5482: "ESH1"}


@pytest.mark.parametrize("path", OTHER_SAMPLES, ids=lambda p: p.name)
def test_other_schemas_are_refused_with_the_file_named(path: Path) -> None:
    with pytest.raises(DBNFormatError, match=rf"{path.name}.*schema is {path.name.split('.')[1]}"):
        read_mbp10(path)
    with pytest.raises(DBNFormatError, match=path.name):
        list(iter_mbp10(path))
    assert read_metadata(path).schema == path.name.split(".")[1]


def _file_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if path.suffix == ".zst":
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
            return reader.read()
    return raw


def _feed_in_chunks(decoder: StreamDecoder, data: bytes, size: int) -> npt.NDArray[np.void]:
    parts = [decoder.feed(data[i : i + size]) for i in range(0, len(data), size)]
    return concat_mbp10([part for part in parts if len(part)])


@pytest.mark.parametrize("path", MBP10_SAMPLES, ids=lambda p: p.name)
def test_stream_decoder_in_chunks_of_every_size(path: Path) -> None:
    reference = _reference(path)
    expected = read_mbp10(path)
    with_metadata = _file_bytes(path)
    bare = record_bytes(expected)
    for size in range(1, len(with_metadata) + 1):
        decoder = StreamDecoder(has_metadata=True)
        got = _feed_in_chunks(decoder, with_metadata, size)
        assert np.array_equal(got, expected), size
        assert decoder.counters.rejected_chunks == 0 and decoder.buffered == 0
        assert decoder.metadata is not None and decoder.version == read_metadata(path).version
    for size in range(1, len(bare) + 1):
        assert np.array_equal(_feed_in_chunks(StreamDecoder(), bare, size), expected), size
    _assert_same(_feed_in_chunks(StreamDecoder(has_metadata=True), with_metadata, 7), reference)


@pytest.mark.parametrize("path", OTHER_SAMPLES, ids=lambda p: p.name)
def test_stream_decoder_counts_other_record_types_without_rejecting(path: Path) -> None:
    reference = _reference(path)
    decoder = StreamDecoder(has_metadata=True)
    assert len(_feed_in_chunks(decoder, path.read_bytes(), 5)) == 0
    assert decoder.counters.rejected_chunks == 0
    assert decoder.counters.other_records == {reference[0].rtype.value: len(reference)}
