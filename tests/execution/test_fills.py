"""Fill and P&L maths against hand-computed books."""

from __future__ import annotations

import numpy as np
import pytest

from agent.execution.fills import (
    PositionArrays,
    apply_fills,
    fees,
    position_change_cost_ticks,
    slippage_vs_mid,
    step_pnl_ticks,
    to_currency,
    walk_book,
)
from feeds.records import PRICE_SCALE, UNDEF_PRICE

# A 3-level ES book in ticks: bid 100/99/98 with 2/3/5, ask 101/102/103 with 1/4/2.
BID_PX = np.array([[100.0, 99.0, 98.0]])
BID_SZ = np.array([[2.0, 3.0, 5.0]])
ASK_PX = np.array([[101.0, 102.0, 103.0]])
ASK_SZ = np.array([[1.0, 4.0, 2.0]])


def _walk(qty: list[float]) -> tuple[np.ndarray, np.ndarray]:
    n = len(qty)
    res = walk_book(
        np.repeat(BID_PX, n, 0),
        np.repeat(BID_SZ, n, 0),
        np.repeat(ASK_PX, n, 0),
        np.repeat(ASK_SZ, n, 0),
        np.array(qty),
    )
    return res.filled, res.avg_price


def test_walk_book_hand_computed() -> None:
    filled, avg = _walk([1, 3, -4, 7, -20, 0])
    # buy 1: 1@101; buy 3: 1@101 + 2@102 = 305/3; sell 4: 2@100 + 2@99 = 398/4;
    # buy 7: 1@101 + 4@102 + 2@103 = 715/7; sell 20: depth 10 only = 2@100+3@99+5@98 = 987/10.
    np.testing.assert_array_equal(filled, [1, 3, -4, 7, -10, 0])
    np.testing.assert_allclose(avg[:5], [101, 305 / 3, 99.5, 715 / 7, 98.7])
    assert np.isnan(avg[5])


def test_walk_book_fixed_point_keeps_precision_and_skips_empty_levels() -> None:
    tick = PRICE_SCALE // 4  # 0.25 in 1e-9 fixed point
    base = 5000 * PRICE_SCALE
    ask_px = np.array([[base + tick, UNDEF_PRICE, base + 3 * tick]], dtype=np.int64)
    ask_sz = np.array([[1, 7, 2]])
    bid_px = np.array([[base, base - tick, base - 2 * tick]], dtype=np.int64)
    bid_sz = np.array([[0, 4, 1]])  # an empty best level is skipped
    res = walk_book(
        np.repeat(bid_px, 2, 0),
        np.repeat(bid_sz, 2, 0),
        np.repeat(ask_px, 2, 0),
        np.repeat(ask_sz, 2, 0),
        np.array([3, -2]),
    )
    np.testing.assert_array_equal(res.filled, [3, -2])
    assert res.avg_price[0] == pytest.approx(base + (tick + 2 * 3 * tick) / 3, abs=1e-3)
    assert res.avg_price[1] == pytest.approx(base - tick, abs=1e-3)


def test_unit_order_at_the_top_costs_half_the_spread_plus_fees() -> None:
    filled, avg = _walk([1, -1])
    mid = np.array([100.5, 100.5])
    np.testing.assert_allclose(slippage_vs_mid(filled, avg, mid), [0.5, 0.5])
    np.testing.assert_allclose(fees(filled, 1.25), [1.25, 1.25])
    # The environment's cost model agrees with the book walk for unit sizes at the top.
    half = np.array([0.5, 0.5])
    np.testing.assert_allclose(position_change_cost_ticks(filled, half, half, 0.1), [0.6, 0.6])
    # a book that moved by arrival: the buy pays 1.5 ticks over the decision's mid, the sell
    # gets 0.5 under it
    np.testing.assert_allclose(
        position_change_cost_ticks(filled, np.array([1.5, 1.5]), half, 0.1), [1.6, 0.6]
    )


def test_positions_open_add_reduce_flip_close() -> None:
    led = PositionArrays.flat(1)
    led = apply_fills(led, np.array([2.0]), np.array([100.0]))
    led = apply_fills(led, np.array([1.0]), np.array([103.0]))  # avg (200 + 103) / 3 = 101
    assert led.position[0] == 3 and led.avg_price[0] == pytest.approx(101.0)
    led = apply_fills(led, np.array([-1.0]), np.array([105.0]))  # realise 1 x 4
    assert led.realised_px[0] == pytest.approx(4.0) and led.avg_price[0] == pytest.approx(101.0)
    led = apply_fills(led, np.array([-5.0]), np.array([99.0]))  # close 2 x -2, open -3 @ 99
    assert led.realised_px[0] == pytest.approx(0.0)
    assert led.position[0] == -3 and led.avg_price[0] == pytest.approx(99.0)
    led = apply_fills(led, np.array([0.0]), np.array([np.nan]))  # no-op, even with a junk price
    assert led.position[0] == -3 and led.avg_price[0] == pytest.approx(99.0)
    led = apply_fills(led, np.array([3.0]), np.array([97.0]))
    assert led.position[0] == 0 and led.avg_price[0] == 0 and led.realised_px[0] == pytest.approx(6.0)
    assert to_currency(led.realised_px, 0.25, 12.5)[0] == pytest.approx(300.0)


def test_step_pnl_matches_ledger_accounting_on_a_random_path() -> None:
    rng = np.random.default_rng(7)
    n = 500
    mid = 1000 + np.cumsum(rng.integers(-2, 3, n)) * 0.5
    buy = rng.choice([0.5, 1.0, 1.5], n)
    sell = rng.choice([-0.5, 0.5, 1.0], n)
    pos = rng.integers(-1, 2, n).astype(np.float64)
    pos[-1] = 0.0  # end flat so the ledger has realised everything
    fee_ticks = 0.08
    prev = np.concatenate([[0.0], pos[:-1]])
    gross, cost = step_pnl_ticks(
        prev,
        pos,
        mid,
        np.concatenate([mid[1:], mid[-1:]]),
        buy_cost_ticks=buy,
        sell_cost_ticks=sell,
        fee_ticks=fee_ticks,
    )
    led = PositionArrays.flat(1)
    fee_total = 0.0
    for t in range(n):
        q = pos[t] - prev[t]
        if q:
            px = mid[t] + buy[t] if q > 0 else mid[t] - sell[t]
            led = apply_fills(led, np.array([q]), np.array([px]))
            fee_total += abs(q) * fee_ticks
    assert (gross - cost).sum() == pytest.approx(led.realised_px[0] - fee_total, abs=1e-9)
