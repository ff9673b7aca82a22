"""Property-based fuzzing of every DBN input path with mutated real DBN bytes.

The stream decoder (NATS messages, socket streams) and the file reader get bit flips,
truncations, splices of garbage and of other record types, and random chunking. They must
never raise past their boundary (the file reader may raise only ``DBNFormatError``), every
chunk with a corrupted record header must be counted as rejected, and whatever comes out must be
well-formed MBP-10 that Databento's own decoder reads identically.
"""

from __future__ import annotations

import datetime as dt
import itertools
import tempfile
from pathlib import Path

import databento
import databento_dbn
import numpy as np
import numpy.typing as npt
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feeds.config import InstrumentSpec, SynthConfig
from feeds.dbn import StreamDecoder, build_metadata, read_mbp10, record_bytes
from feeds.dbn.framing import MBP10_LENGTH, MBP10_SIZE, concat_mbp10
from feeds.errors import DBNFormatError
from feeds.records import MBP10_DTYPE, MBP10_RTYPE
from feeds.synth import simulate_session
from tests.conftest import DBN_SAMPLES

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPEC = InstrumentSpec(symbol="ES", instrument_id=1001, session_start="14:00", session_end="14:01")
RECORDS: npt.NDArray[np.void] = simulate_session(
    SPEC, dt.date(2024, 3, 4), SynthConfig(), seed=11, open_tick=20_000
).records[:24]
CLEAN = record_bytes(RECORDS)
METADATA = bytes(build_metadata(dataset="SYNTH", symbols={1001: "ES"}, start_ns=0, end_ns=None))
TRADES = np.asarray(
    databento.DBNStore.from_bytes((DBN_SAMPLES / "test_data.trades.dbn").read_bytes()).to_ndarray()
)
HEADER_OFFSETS = {i * MBP10_SIZE + j for i in range(len(RECORDS)) for j in (0, 1)}


def _well_formed(records: npt.NDArray[np.void]) -> None:
    assert records.dtype == MBP10_DTYPE and records.ndim == 1
    assert np.all(records["length"] == MBP10_LENGTH)
    assert np.all(records["rtype"] == MBP10_RTYPE)


def _databento_reads_the_same(message: bytes, ours: npt.NDArray[np.void]) -> None:
    """A message we accept decodes without error in databento_dbn, to the same MBP-10 records."""
    decoder = databento_dbn.DBNDecoder(has_metadata=False, input_version=3)
    decoded = decoder.write_and_decode(message)
    theirs = b"".join(bytes(r) for r in decoded if isinstance(r, databento_dbn.MBP10Msg))
    assert theirs == ours.tobytes()


@st.composite
def flips(draw: st.DrawFn, size: int) -> list[tuple[int, int]]:
    """Bit flips as (byte offset, bit)."""
    return draw(
        st.lists(
            st.tuples(st.integers(0, size - 1), st.integers(0, 7)),
            min_size=1,
            max_size=6,
            unique_by=lambda f: f[0],
        )
    )


def _flip(data: bytes, where: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for offset, bit in where:
        out[offset] ^= 1 << bit
    return bytes(out)


@st.composite
def cuts(draw: st.DrawFn, size: int) -> list[int]:
    """Chunk boundaries over ``size`` bytes (random chunking)."""
    points = draw(st.lists(st.integers(1, max(1, size - 1)), max_size=12))
    return sorted({0, size, *points})


@FUZZ
@given(data=st.data())
def test_stream_decoder_survives_bit_flips_in_random_chunks(data: st.DataObject) -> None:
    where = data.draw(flips(len(CLEAN)))
    mutated = _flip(CLEAN, where)
    bounds = data.draw(cuts(len(mutated)))
    decoder = StreamDecoder()
    outputs = [decoder.feed(mutated[a:b]) for a, b in itertools.pairwise(bounds)]
    for out in outputs:
        _well_formed(out)
    got = concat_mbp10([o for o in outputs if len(o)])
    counters = decoder.counters
    assert (
        counters.records == len(got) and counters.bytes == len(mutated) and counters.chunks == len(bounds) - 1
    )
    if any(offset in HEADER_OFFSETS for offset, _ in where):
        assert counters.rejected_chunks >= 1
    else:  # payload corruption cannot be seen by framing: it comes through, exactly as sent
        assert counters.rejected_chunks == 0 and got.tobytes() == mutated


@FUZZ
@given(data=st.data())
def test_message_framing_counts_every_bad_message(data: st.DataObject) -> None:
    decoder = StreamDecoder(framing="message")
    expected_rejects = 0
    for _ in range(data.draw(st.integers(1, 6))):
        start = data.draw(st.integers(0, len(RECORDS) - 1))
        stop = data.draw(st.integers(start + 1, len(RECORDS)))
        message = record_bytes(RECORDS[start:stop])
        mutation = data.draw(st.sampled_from(["none", "truncate", "flip", "garbage", "splice-trades"]))
        bad: bool | None = False
        if mutation == "truncate":
            message = message[: data.draw(st.integers(1, len(message) - 1))]
            bad = True
        elif mutation == "flip":
            where = data.draw(flips(len(message)))
            message = _flip(message, where)
            bad = any(offset % MBP10_SIZE in (0, 1) for offset, _ in where)
        elif mutation == "garbage":
            message = data.draw(st.binary(min_size=1, max_size=800))
            bad = None  # random bytes are rejected unless they happen to frame real records
        elif mutation == "splice-trades":
            message = message + TRADES.tobytes()  # v2 trades are also well-formed v3 trades
        before = decoder.counters.rejected_chunks
        out = decoder.feed(message)
        _well_formed(out)
        rejected = decoder.counters.rejected_chunks - before
        if bad is True:
            expected_rejects += 1
            assert rejected == 1 and len(out) == 0
        elif bad is False:
            assert rejected == 0
            assert out.tobytes() == message[: len(out) * MBP10_SIZE]
        if rejected == 0:
            _databento_reads_the_same(message, out)
    assert decoder.counters.rejected_chunks >= expected_rejects


@FUZZ
@given(data=st.data())
def test_stream_with_metadata_survives_garbage_and_splices(data: st.DataObject) -> None:
    stream = METADATA + CLEAN
    kind = data.draw(st.sampled_from(["flip", "splice", "truncate"]))
    if kind == "flip":
        stream = _flip(stream, data.draw(flips(len(stream))))
    elif kind == "splice":
        at = data.draw(st.integers(0, len(stream)))
        stream = stream[:at] + data.draw(st.binary(min_size=1, max_size=400)) + stream[at:]
    else:
        stream = stream[: data.draw(st.integers(0, len(stream)))]
    bounds = data.draw(cuts(len(stream)))
    decoder = StreamDecoder(has_metadata=True)
    total = 0
    for a, b in itertools.pairwise(bounds):
        out = decoder.feed(stream[a:b])
        _well_formed(out)
        total += len(out)
    assert decoder.counters.records == total <= len(RECORDS) + 400 // MBP10_SIZE


@FUZZ
@given(data=st.data(), compressed=st.booleans())
def test_file_reader_raises_only_dbn_format_errors(data: st.DataObject, compressed: bool) -> None:
    plain = METADATA + CLEAN
    raw = zstandard.ZstdCompressor().compress(plain) if compressed else plain
    kind = data.draw(st.sampled_from(["flip", "truncate", "splice"]))
    if kind == "flip":
        where = data.draw(flips(len(raw)))
        mutated = _flip(raw, where)
    elif kind == "truncate":
        mutated = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        at = data.draw(st.integers(0, len(raw)))
        mutated = raw[:at] + data.draw(st.binary(min_size=1, max_size=400)) + raw[at:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("x.dbn.zst" if compressed else "x.dbn")
        path.write_bytes(mutated)
        try:
            records = read_mbp10(path)
        except DBNFormatError as exc:
            assert path.name in str(exc)
            return
    _well_formed(records)
    if kind == "flip" and not compressed and all(offset >= len(METADATA) for offset, _ in where):
        header_hit = any((offset - len(METADATA)) in HEADER_OFFSETS for offset, _ in where)
        assert not header_hit, "a corrupted record header was read as valid"
        sent = np.frombuffer(mutated[len(METADATA) :], dtype=MBP10_DTYPE)
        # read_mbp10 sorts by ts_recv (stable), and a flip may have hit a timestamp.
        assert records.tobytes() == sent[np.argsort(sent["ts_recv"], kind="stable")].tobytes()


def test_the_fuzz_corpus_is_real_dbn() -> None:
    """The bytes mutated above are what Databento itself reads as these records."""
    store = databento.DBNStore.from_bytes(METADATA + CLEAN)
    assert np.array_equal(np.asarray(store.to_ndarray()), RECORDS)
    assert len(TRADES) == 2 and TRADES.dtype.itemsize == 48


@pytest.mark.parametrize("size", [1, 7, 368, 369, 4096])
def test_clean_stream_in_fixed_chunks_is_exact(size: int) -> None:
    decoder = StreamDecoder(has_metadata=True)
    stream = METADATA + CLEAN
    got = concat_mbp10(
        [o for o in (decoder.feed(stream[i : i + size]) for i in range(0, len(stream), size)) if len(o)]
    )
    assert got.tobytes() == CLEAN and decoder.counters.rejected_chunks == 0
