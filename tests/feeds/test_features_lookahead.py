"""No feature looks ahead: a spike planted at record j changes no bar that closes before j."""

from __future__ import annotations

import numpy as np
import pytest

from feeds.config import BarConfig, HealthConfig, InstrumentSpec
from feeds.features import BarFrame, IncrementalBars, compute_bars
from feeds.records import ACTION_TRADE, LEVELS, SIDE_BID
from tests.feeds.recbuild import random_book

SPEC = InstrumentSpec(symbol="ES", instrument_id=1001)
HEALTH = HealthConfig()


def plant_spike(records: np.ndarray, j: int) -> np.ndarray:
    """A copy of ``records`` with a price jump, a size spike (order-flow imbalance) and a large
    buyer-initiated trade at record ``j``."""
    spiked = records.copy()
    rec = spiked[j : j + 1]
    for k in range(LEVELS):
        rec[f"bid_px_{k:02d}"] += 10 * 250_000_000
        rec[f"ask_px_{k:02d}"] += 10 * 250_000_000
        rec[f"bid_sz_{k:02d}"] *= 50
    rec["action"], rec["side"], rec["size"] = ACTION_TRADE, SIDE_BID, 5000
    return spiked


def frames(records: np.ndarray, bars: BarConfig) -> tuple[BarFrame, BarFrame]:
    vectorised = compute_bars(records, SPEC, bars, HEALTH)
    incremental = BarFrame.concat(IncrementalBars(SPEC, bars, HEALTH).push_records(records))
    return vectorised, incremental


@pytest.mark.parametrize(
    "bars",
    [BarConfig(clock="time", interval_s=0.5), BarConfig(clock="events", events=25)],
    ids=["time", "events"],
)
@pytest.mark.parametrize("j", [3001, 6543, 9000])
def test_a_future_spike_cannot_change_an_earlier_bar(bars: BarConfig, j: int) -> None:
    records = random_book(12_000, seed=j, mean_gap_ns=20_000_000)
    ts_j = int(records["ts_recv"][j])
    for clean, spiked in zip(frames(records, bars), frames(plant_spike(records, j), bars), strict=True):
        before = clean.ts_close < ts_j
        assert 0 < before.sum() < len(clean)
        np.testing.assert_array_equal(clean.features[before], spiked.features[before], strict=True)
        np.testing.assert_array_equal(clean.mid_price[before], spiked.mid_price[before], strict=True)
        np.testing.assert_array_equal(clean.tradable[before], spiked.tradable[before], strict=True)
        # the test has teeth: the bar holding record j does see the spike
        holding = int(np.argmax(~before))
        assert not np.array_equal(clean.features[holding], spiked.features[holding])
