"""Feature definitions checked against hand computations and a textbook per-record reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from feeds.book import level_arrays
from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.errors import FeedError
from feeds.features import FEATURE_NAMES, compute_all, compute_bars
from feeds.health import RECORD_FAULTS, record_faults
from feeds.records import ACTION_TRADE, LEVELS, SIDE_ASK, SIDE_BID, SIDE_NONE, UNDEF_PRICE
from tests.feeds.recbuild import T0, TICK, Row, book_records, random_book

SPEC = InstrumentSpec(symbol="ES", instrument_id=1001, tick_size=TICK)
HEALTH = HealthConfig()
MS = 1_000_000
COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


def test_feature_names_are_unique_and_sized() -> None:
    assert 24 <= len(FEATURE_NAMES) <= 48
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)


def reference_ofi(records: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per-level OFI summed per bar, record by record, straight from the definition."""
    lv = level_arrays(records)
    faults = record_faults(
        records, lv.bid_px[:, 0].copy(), lv.ask_px[:, 0].copy(), prev=None, tick=250_000_000, config=HEALTH
    )
    ok = (faults & RECORD_FAULTS) == 0
    per_record = np.zeros((len(records), LEVELS), dtype=np.int64)
    for i in range(1, len(records)):
        if not (ok[i] and ok[i - 1]):
            continue
        for m in range(LEVELS):
            b1, b0 = int(lv.bid_px[i, m]), int(lv.bid_px[i - 1, m])
            b1, b0 = (-1 if b1 == UNDEF_PRICE else b1), (-1 if b0 == UNDEF_PRICE else b0)
            a1, a0 = int(lv.ask_px[i, m]), int(lv.ask_px[i - 1, m])
            qb1, qb0 = int(lv.bid_sz[i, m]), int(lv.bid_sz[i - 1, m])
            qa1, qa0 = int(lv.ask_sz[i, m]), int(lv.ask_sz[i - 1, m])
            per_record[i, m] = qb1 * (b1 >= b0) - qb0 * (b1 <= b0) - qa1 * (a1 <= a0) + qa0 * (a1 >= a0)
    starts = np.concatenate(([0], ends[:-1]))
    return np.array([per_record[s:e].sum(axis=0) for s, e in zip(starts, ends, strict=True)])


def rough_book(n: int, seed: int) -> np.ndarray:
    """A random book with empty deep levels, ladder shifts on every side and a few bad records."""
    rng = np.random.default_rng(seed)
    records = random_book(n, seed=seed)
    for k in (8, 9):
        for side in ("bid", "ask"):
            empty = rng.random(n) < 0.3
            records[f"{side}_px_{k:02d}"][empty] = UNDEF_PRICE
            records[f"{side}_sz_{k:02d}"][empty] = 0
    shift = rng.random(n) < 0.1
    for k in range(LEVELS):
        records[f"bid_px_{k:02d}"][shift] -= 250_000_000 * rng.integers(1, 3)
    crossed = rng.random(n) < 0.01
    records["bid_px_00"][crossed] = records["ask_px_00"][crossed]
    return records


@pytest.mark.parametrize(("events", "n"), [(1, 3000), (64, 3000), (7, 80_000)])  # 80k: several groups
def test_ofi_equals_the_textbook_definition(events: int, n: int) -> None:
    records = rough_book(n, seed=events)
    frame = compute_bars(records, SPEC, BarConfig(clock="events", events=events), HEALTH)
    ends = np.arange(events, len(records) + 1, events)
    got = frame.features[:, COL["ofi_l1"] : COL["ofi_l1"] + LEVELS]
    want = reference_ofi(records[: ends[-1]], ends)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    np.testing.assert_array_equal(frame.features[:, COL["ofi_total"]], want.sum(axis=1).astype(np.float32))
    assert np.abs(want).sum() > 0


def test_trades_returns_and_book_of_a_hand_built_bar() -> None:
    rows = [
        Row(ts=100 * MS, bid=4000, ask=4001),
        Row(ts=1100 * MS, action=ACTION_TRADE, side=SIDE_BID, price=4001, size=3),
        Row(ts=1200 * MS, action=ACTION_TRADE, side=SIDE_ASK, price=4000, size=5),
        Row(ts=1300 * MS, action=ACTION_TRADE, side=SIDE_NONE, price=4000, size=2),
        Row(ts=1400 * MS, bid=4002, ask=4003),
        Row(ts=2500 * MS),
    ]
    frame = compute_bars(book_records(rows), SPEC, BarConfig(interval_s=1.0), HEALTH)
    assert ((frame.ts_close - T0) // MS).tolist() == [1000, 2000]
    f = frame.features[1]
    assert f[COL["trade_volume_signed"]] == 3 - 5
    assert f[COL["trade_volume"]] == 10
    assert f[COL["trade_count"]] == 3
    assert f[COL["update_count"]] == 4
    assert f[COL["mid_change_ticks"]] == 2.0
    assert f[COL["mid_logret"]] == np.float32(math.log(4002.5 / 4000.5))
    assert f[COL["realized_var_ticks2"]] == 4.0  # one step of 2 ticks
    assert f[COL["bar_seconds"]] == 1.0
    angle = 2 * math.pi * ((T0 + 2 * 10**9) % (86400 * 10**9)) / (86400 * 10**9)
    assert f[COL["tod_sin"]] == pytest.approx(math.sin(angle), abs=1e-6)
    assert frame.mid_price[1] == 4002.5 * TICK
    assert (frame.bid_price[1], frame.ask_price[1]) == (4002 * TICK, 4003 * TICK)
    assert (frame.bid_size[1], frame.ask_size[1]) == (10, 10)
    assert frame.close_index.tolist() == [0, 4]
    assert frame.features[0, COL["mid_logret"]] == 0.0  # first bar: no previous close


def test_book_features_by_hand() -> None:
    # bid 4000 x 3, ask 4002 x 1 (deeper levels: bid sizes 3+k, ask sizes 1+2k)
    records = book_records([Row(ts=1, bid=4000, ask=4002, bid_sz=3, ask_sz=1)])
    frame = compute_bars(records, SPEC, BarConfig(clock="events", events=1), HEALTH)
    f = dict(zip(FEATURE_NAMES, frame.features[0].tolist(), strict=True))
    assert (frame.mid_ticks[0], frame.spread_ticks[0]) == (4001.0, 2.0)
    # microprice = (b*qa + a*qb)/(qa+qb) = (1000*1 + 1000.5*3)/4 = 1000.375; mid 1000.25
    assert f["microprice_offset_ticks"] == pytest.approx(0.5)
    assert f["depth_imbalance_l1"] == pytest.approx((3 - 1) / 4)
    bid3, ask3 = 3 + 4 + 5, 1 + 3 + 5
    assert f["depth_imbalance_l3"] == pytest.approx((bid3 - ask3) / (bid3 + ask3))
    bid10 = sum(3 + k for k in range(LEVELS))
    ask10 = sum(1 + 2 * k for k in range(LEVELS))
    assert f["depth_imbalance_l10"] == pytest.approx((bid10 - ask10) / (bid10 + ask10))
    assert f["log_depth_bid_l10"] == pytest.approx(math.log1p(bid10))
    assert (frame.bid_price[0], frame.ask_price[0], frame.mid_price[0]) == (1000.0, 1000.5, 1000.25)
    assert (frame.bid_size[0], frame.ask_size[0]) == (3, 1)


def test_no_healthy_book_yet_gives_zeros_not_nan() -> None:
    rows = [Row(ts=MS, bid=None), Row(ts=2 * MS, bid=4001, ask=4000), Row(ts=3 * MS), Row(ts=4 * MS)]
    frame = compute_bars(book_records(rows), SPEC, BarConfig(clock="events", events=1), HEALTH)
    assert np.isfinite(frame.features).all()
    assert frame.tradable.tolist() == [False, False, True, True]
    assert (frame.features[:2, COL["spread_ticks"]] == 0).all()
    assert frame.mid_price[:2].tolist() == [0.0, 0.0]
    assert frame.features[2, COL["mid_logret"]] == 0.0  # first healthy mid: no return yet


def test_interleaved_instruments_are_split_and_unknown_ones_counted() -> None:
    es = random_book(500, seed=1, instrument_id=1001)
    nq = random_book(400, seed=2, instrument_id=1002)
    other = random_book(50, seed=3, instrument_id=77)
    mixed = np.concatenate([es, nq, other])
    mixed = mixed[np.argsort(mixed["ts_recv"], kind="stable")]
    specs = [SPEC, InstrumentSpec(symbol="NQ", instrument_id=1002, tick_size=TICK)]
    bars = BarConfig(clock="events", events=50)
    result = compute_all(mixed, specs, bars, HEALTH)
    assert result.rejected_records == 50
    alone = compute_bars(es, SPEC, bars, HEALTH)
    np.testing.assert_array_equal(result.frames["ES"].features, alone.features)
    assert len(result.frames["NQ"]) == 8
    # close_index points into the mixed input at the instrument's closing record
    idx = result.frames["ES"].close_index
    assert (mixed["instrument_id"][idx] == 1001).all()
    assert (mixed["ts_recv"][idx] == result.frames["ES"].ts_close).all()


def test_a_strided_view_gives_the_same_bars() -> None:
    records = random_book(4000, seed=5)
    bars = BarConfig(clock="events", events=9)
    np.testing.assert_array_equal(
        compute_bars(records[::2], SPEC, bars, HEALTH).features,
        compute_bars(records[::2].copy(), SPEC, bars, HEALTH).features,
    )


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(FeedError, match="MBP-10"):
        compute_bars(np.zeros(4, dtype=np.int64), SPEC, BarConfig(), HEALTH)
    with pytest.raises(FeedError, match="stale_after_s"):
        compute_bars(random_book(10), SPEC, BarConfig(), HealthConfig(stale_after_s=0.0))
