"""Book views and book-at-a-point quantities, on the official samples and hand-built books."""

from __future__ import annotations

import databento
import numpy as np
import pytest

from feeds.book import BOOK_COLUMNS, BookSnapshot, book_columns, level_arrays, tick_fixed
from feeds.errors import FeedError
from feeds.records import LEVELS, UNDEF_PRICE
from tests.conftest import DBN_SAMPLES
from tests.feeds.recbuild import Row, book_records

SAMPLES = sorted(DBN_SAMPLES.glob("test_data.mbp-10*.dbn*"))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_level_views_match_databento_fields(path) -> None:
    store = databento.DBNStore.from_bytes(path.read_bytes())
    records = store.to_ndarray()
    levels = level_arrays(records)
    for i, msg in enumerate(store):
        for k in range(LEVELS):
            assert levels.bid_px[i, k] == msg.levels[k].bid_px
            assert levels.ask_px[i, k] == msg.levels[k].ask_px
            assert levels.bid_sz[i, k] == msg.levels[k].bid_sz
            assert levels.ask_sz[i, k] == msg.levels[k].ask_sz


def test_book_columns_by_hand() -> None:
    # bid 4000 x 3, ask 4002 x 1 (deeper levels: bid sizes 3+k, ask sizes 1+2k)
    records = book_records([Row(ts=1, bid=4000, ask=4002, bid_sz=3, ask_sz=1)])
    cols = dict(
        zip(
            BOOK_COLUMNS, book_columns(level_arrays(records), np.array([0]), tick_fixed(0.25))[0], strict=True
        )
    )
    assert cols["mid_ticks"] == 4001.0
    assert cols["spread_ticks"] == 2.0
    # microprice = (b*qa + a*qb)/(qa+qb) = (1000*1 + 1000.5*3)/4 = 1000.375; mid 1000.25
    assert cols["microprice_offset_ticks"] == pytest.approx(0.5)
    assert cols["depth_imbalance_l1"] == pytest.approx((3 - 1) / 4)
    bid3, ask3 = 3 + 4 + 5, 1 + 3 + 5
    assert cols["depth_imbalance_l3"] == pytest.approx((bid3 - ask3) / (bid3 + ask3))
    bid10 = sum(3 + k for k in range(LEVELS))
    ask10 = sum(1 + 2 * k for k in range(LEVELS))
    assert cols["depth_imbalance_l10"] == pytest.approx((bid10 - ask10) / (bid10 + ask10))
    assert cols["log_depth_bid_l10"] == pytest.approx(np.log1p(bid10))
    assert (cols["bid_price"], cols["ask_price"], cols["mid_price"]) == (1000.0, 1000.5, 1000.25)
    assert (cols["bid_size"], cols["ask_size"]) == (3.0, 1.0)


def test_snapshot_and_empty_sides() -> None:
    snap = BookSnapshot.from_record(book_records([Row(ts=1, bid=None, ask=4001)])[0])
    assert snap.best_bid is None
    assert snap.best_ask == 4001 * tick_fixed(0.25)
    assert snap.bid_px == (UNDEF_PRICE,) * LEVELS


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(FeedError, match="tick_size"):
        tick_fixed(0.0)
    with pytest.raises(FeedError, match="MBP-10"):
        level_arrays(np.zeros(3, dtype=np.int64))
