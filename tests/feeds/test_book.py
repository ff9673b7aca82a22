"""Book views and book-at-a-point quantities, on the official samples and hand-built books."""

from __future__ import annotations

import databento
import numpy as np
import pytest

from feeds.book import BookSnapshot, level_arrays, tick_fixed
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
