"""The rounds in which closed bars are decided (agent.trading.step.decision_rounds), which the
daemon's decision task and the event-driven backtest both follow."""

from __future__ import annotations

import dataclasses

import numpy as np

from agent.trading.step import BarClose, decision_rounds
from feeds.features import BarFrame


def _frame(instrument_id: int, bars: int) -> BarFrame:
    empty = BarFrame.empty(instrument_id, f"I{instrument_id}")
    return dataclasses.replace(empty, ts_close=np.arange(bars, dtype=np.int64) + 100 * instrument_id)


def _shape(rounds: list[list[tuple[str, BarClose, bool]]]) -> list[list[tuple[str, int, int, bool]]]:
    return [[(item, c.instrument_id, c.row, last) for item, c, last in r] for r in rounds]


def test_one_bar_an_instrument_is_one_round_in_first_appearance_order() -> None:
    items = {"b": _frame(2, 1), "a": _frame(1, 1), "c": _frame(3, 1)}
    rounds = decision_rounds(items, items.__getitem__)
    assert _shape(rounds) == [[("b", 2, 0, True), ("a", 1, 0, True), ("c", 3, 0, True)]]


def test_round_r_holds_each_instruments_r_th_bar_and_only_the_last_may_trade() -> None:
    items = {"x1": _frame(1, 2), "y": _frame(2, 1), "x2": _frame(1, 1), "empty": _frame(3, 0)}
    rounds = decision_rounds(items, items.__getitem__)
    assert _shape(rounds) == [
        [("x1", 1, 0, False), ("y", 2, 0, True)],
        [("x1", 1, 1, False)],
        [("x2", 1, 0, True)],
    ]


def test_a_frame_without_bars_adds_nothing() -> None:
    items = {"empty": _frame(3, 0), "a": _frame(1, 1)}
    assert _shape(decision_rounds(items, items.__getitem__)) == [[("a", 1, 0, True)]]
    assert decision_rounds({"e": _frame(1, 0)}, {"e": _frame(1, 0)}.__getitem__) == []
