"""Order manager state transitions and the portfolio's ledger accounting."""

from __future__ import annotations

import pytest

from agent.execution.orders import OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import Ack, Cancelled, Fill, Reject
from feeds.config import InstrumentSpec
from tests.execution.books import TICK, px

ES = InstrumentSpec(symbol="ES", instrument_id=1001, tick_size=0.25, tick_value=12.5)
NQ = InstrumentSpec(symbol="NQ", instrument_id=1002, tick_size=0.25, tick_value=5.0)


def _fill(seq: int, coid: str, side: str, qty: int, price: int, *, leaves: int, fee: float = 1.0) -> Fill:
    return Fill(
        seq=seq,
        fill_id=f"{coid}.{seq}",
        client_order_id=coid,
        instrument_id=ES.instrument_id,
        side=side,  # type: ignore[arg-type]
        qty=qty,
        price=price,
        fee=fee,
        leaves_qty=leaves,
        ts_ns=seq,
    )


def test_orders_stay_open_until_a_report_closes_them() -> None:
    orders = OrderManager("7")
    buy = orders.new(ES.instrument_id, "buy", 5, ts_ns=1, wall_ns=100)
    sell = orders.new(ES.instrument_id, "sell", 2, ts_ns=1, wall_ns=100)
    assert (buy.client_order_id, sell.client_order_id) == ("7-1", "7-2")
    assert orders.working(ES.instrument_id) == 3
    assert orders.unacked_since(200) != [] and orders.working(NQ.instrument_id) == 0
    assert orders.apply(Ack(seq=1, client_order_id="7-1", ts_ns=2))
    assert orders.apply(_fill(2, "7-1", "buy", 3, px(1), leaves=2))
    assert orders.working(ES.instrument_id) == 0  # +2 left on the buy, -2 on the sell
    assert orders.apply(Cancelled(seq=3, client_order_id="7-2", cancelled_qty=2, reason="x", ts_ns=3))
    assert orders.apply(_fill(4, "7-1", "buy", 2, px(1), leaves=0))
    assert orders.open_orders() == [] and orders.last_seq == 4
    # A replayed or unknown report changes nothing and is counted.
    assert not orders.apply(_fill(4, "7-1", "buy", 2, px(1), leaves=0))
    assert not orders.apply(Reject(seq=5, client_order_id="nope", reason="x", ts_ns=5))
    assert orders.ignored_reports == 2


def test_portfolio_books_fills_with_the_shared_ledger_maths() -> None:
    book = Portfolio([ES, NQ])
    book.apply(_fill(1, "a", "buy", 2, px(0), leaves=0, fee=2.0))
    book.apply(_fill(2, "b", "sell", 3, px(4), leaves=0, fee=3.0))  # closes 2 (+4 ticks each), opens -1
    assert book.positions() == {ES.instrument_id: -1, NQ.instrument_id: 0}
    assert book.realised() == pytest.approx(2 * 4 * 12.5 - 5.0)
    # Short 1 from +4 ticks, marked at +2 ticks: +2 ticks of profit.
    assert book.unrealised({ES.instrument_id: px(2)}) == pytest.approx(25.0)


def test_portfolio_realised_follows_every_fill_and_restore() -> None:
    """The realised P&L is read every decision round and computed once per change of the books:
    a fill or a restore after a read must show in the next read."""
    book = Portfolio([ES, NQ])
    assert book.realised() == 0.0
    book.apply(_fill(1, "a", "buy", 2, px(0), leaves=0, fee=2.0))
    assert book.realised() == pytest.approx(-2.0)
    book.apply(_fill(2, "b", "sell", 2, px(4), leaves=0, fee=2.0))
    assert book.realised() == pytest.approx(2 * 4 * 12.5 - 4.0)
    book.restore(NQ.instrument_id, 1, float(px(0)), float(TICK), 1.0)  # +1 tick realised, 1.0 fees
    assert book.realised() == pytest.approx(2 * 4 * 12.5 - 4.0 + 5.0 - 1.0)


def test_portfolio_reads_follow_every_fill_and_restore() -> None:
    """Positions, entry prices and the unrealised P&L are read from Python copies of the books:
    each fill and restore shows in the next read, and a flat instrument's mark (even NaN, an
    untrusted book) adds nothing."""
    book = Portfolio([ES, NQ])
    assert book.positions() == {ES.instrument_id: 0, NQ.instrument_id: 0}
    assert book.unrealised({ES.instrument_id: float("nan"), NQ.instrument_id: px(3)}) == 0.0
    book.apply(_fill(1, "a", "buy", 2, px(0), leaves=0))
    book.apply(_fill(2, "b", "buy", 1, px(3), leaves=0))  # 3 long at +1 tick on average
    assert book.position(ES.instrument_id) == 3 and isinstance(book.position(ES.instrument_id), int)
    assert book.avg_price(ES.instrument_id) == pytest.approx(px(1))
    assert book.unrealised({ES.instrument_id: px(2)}) == pytest.approx(3 * 12.5)
    book.restore(NQ.instrument_id, -2, float(px(5)), 0.0, 0.0)
    assert book.positions() == {ES.instrument_id: 3, NQ.instrument_id: -2}
    assert book.avg_price(NQ.instrument_id) == pytest.approx(px(5))
    # NQ short 2 from +5 ticks marked at +1: +8 ticks; ES unmarked counts as its entry
    assert book.unrealised({NQ.instrument_id: px(1)}) == pytest.approx(2 * 4 * NQ.tick_value)
