"""The feature package's surface and the layouts it derives: the columns from the feature list,
the incremental path's record fields from the MBP-10 layout."""

from __future__ import annotations

import numpy as np
import pytest

import feeds.features
from feeds.features import BOOK_INTS, FEATURE_NAMES
from feeds.features.definitions import COLUMNS, FEATURES, Feature, feature_rows
from feeds.features.record_fields import RECORD
from feeds.features.statistics import BarStatistics
from feeds.records import LEVELS
from tests.feeds.recbuild import random_book


def test_the_public_surface_is_pinned() -> None:
    assert sorted(feeds.features.__all__) == sorted(
        [
            "BOOK_INTS",
            "FEATURE_NAMES",
            "FILE_CHUNK_RECORDS",
            "BarFrame",
            "FeatureSet",
            "FeatureStream",
            "IncrementalBars",
            "IncrementalFeatures",
            "compute_all",
            "compute_bars",
            "compute_file",
            "ofi_price_term",
        ]
    )
    assert all(hasattr(feeds.features, name) for name in feeds.features.__all__)


def test_columns_derive_from_the_feature_list() -> None:
    assert tuple(name for feature in FEATURES for name in feature.names) == FEATURE_NAMES
    assert [COLUMNS[name] for name in FEATURE_NAMES] == list(range(len(FEATURE_NAMES)))
    assert FEATURE_NAMES[COLUMNS["ofi_l1"] : COLUMNS["ofi_l1"] + LEVELS] == tuple(
        f"ofi_l{m}" for m in range(1, LEVELS + 1)
    )


def test_a_feature_names_only_statistics_the_bars_keep() -> None:
    with pytest.raises(TypeError, match=r"needs \['mid_price'\], which are not BarStatistics fields"):
        Feature(("mid",), ("mid_price",), lambda out, mid: None)
    with pytest.raises(TypeError, match="at least one statistic"):
        Feature(("constant",), (), lambda out: None)


def hand_statistics() -> BarStatistics:
    """Three bars: no book yet, then a book (bid 3 @ 4500.00, ask 1 @ 4500.50), then a tick up."""
    tick = 250_000_000
    bid = 4500 * 10**9
    book = np.zeros((3, len(BOOK_INTS)), np.int64)
    book[1] = [bid, bid + 2 * tick, 3, 1, 3, 9, 15, 30, 1, 6, 12, 25]
    book[2] = book[1] + [tick, tick, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    mid2 = book[:, 0] + book[:, 1]
    i8 = lambda *v: np.array(v, np.int64)  # noqa: E731
    return BarStatistics(
        close_ts=i8(10**9, 2 * 10**9, 3 * 10**9),
        close_ts_before=i8(10**9, 10**9, 2 * 10**9),
        mid2=mid2,
        mid2_before=i8(0, mid2[0], mid2[1]),
        book=book,
        signed_volume=i8(0, 2, -1),
        volume=i8(0, 2, 5),
        trades=i8(0, 1, 2),
        rv_half_ticks2=i8(0, 0, 4),
        ofi=np.zeros((3, LEVELS), np.int64),
        n_records=i8(0, 3, 4),
        close_index=i8(-1, 2, 6),
        tradable=np.array([False, True, True]),
        tick=tick,
    )


def test_every_feature_writes_all_its_rows_without_nan() -> None:
    """Each definition fills every element of its rows (a row left unwritten keeps np.empty's
    garbage), with 0 for an empty denominator: no book, no previous mid."""
    stats = hand_statistics()
    for feature in FEATURES:
        out = np.full((len(feature.names), 3), np.nan)
        feature.evaluate(stats, out)
        assert np.isfinite(out).all(), feature.names
    rows = dict(zip(FEATURE_NAMES, feature_rows(stats), strict=True))
    np.testing.assert_array_equal(rows["spread_ticks"], [0, 2, 2])
    np.testing.assert_array_equal(rows["microprice_offset_ticks"], [0, 0.5, 0.5])  # 2 (3 - 1) / (2 * 4)
    np.testing.assert_array_equal(rows["depth_imbalance_l1"], [0, 0.5, 0.5])
    np.testing.assert_array_equal(rows["mid_change_ticks"], [0, 0, 1])
    assert rows["mid_logret"][2] == pytest.approx(np.log(4500.5 / 4500.25), rel=1e-12)
    np.testing.assert_array_equal(rows["realized_var_ticks2"], [0, 0, 1])
    np.testing.assert_array_equal(rows["bar_seconds"], [0, 1, 1])


def test_the_record_struct_reads_the_fields_of_the_mbp10_layout() -> None:
    records = random_book(3, seed=4)
    for record in records:
        values = RECORD.unpack(record.tobytes())
        assert values[:9] == (
            int(record["length"]),
            int(record["rtype"]),
            int(record["instrument_id"]),
            int(record["price"]),
            int(record["size"]),
            record["action"],
            record["side"],
            int(record["ts_recv"]),
            int(record["sequence"]),
        )
        levels = values[9:]
        for k in range(LEVELS):
            assert levels[4 * k : 4 * k + 4] == tuple(
                int(record[f"{name}_{k:02d}"]) for name in ("bid_px", "ask_px", "bid_sz", "ask_sz")
            )
