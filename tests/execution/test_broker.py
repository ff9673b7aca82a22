"""Paper broker: latency, book walk with partial fills and fees, resting limits, cancels."""

from __future__ import annotations

import numpy as np

from agent.execution.broker import PaperBroker
from agent.execution.config import BrokerConfig
from agent.execution.protocol import Ack, Cancelled, CancelOrder, Fill, NewOrder, Reject
from feeds.records import ACTION_TRADE
from tests.execution.books import px, record

MS = 1_000_000
ES = 1001


def _broker(latency_ms: float = 1.0, fee: float = 2.0) -> PaperBroker:
    return PaperBroker(BrokerConfig(latency_ms=latency_ms, fee_per_contract=fee), [ES])


def _book(ts: int, **kw: object) -> np.ndarray:
    bids = [(px(-1), 5), (px(-2), 10)]
    asks = [(px(1), 3), (px(2), 4), (px(3), 2)]
    return record(ES, ts, bids, asks, **kw)  # type: ignore[arg-type]


def _order(coid: str, side: str, qty: int, ts: int, **kw: object) -> NewOrder:
    return NewOrder(client_order_id=coid, instrument_id=ES, side=side, qty=qty, ts_ns=ts, **kw)  # type: ignore[arg-type]


def test_market_order_fills_after_latency_against_the_book_then() -> None:
    broker = _broker()
    assert broker.on_records(_book(0)) == []
    assert broker.submit(_order("o1", "buy", 5, ts=10 * MS)) == []
    # A record before the arrival time does not execute the order.
    assert broker.on_records(_book(10 * MS + MS // 2)) == []
    # The book changes after arrival; the order saw the book as it stood at arrival.
    later = record(ES, 12 * MS, [(px(-1), 1)], [(px(5), 1)])
    reports = broker.on_records(later)
    assert isinstance(reports[0], Ack) and reports[0].ts_ns == 11 * MS
    fill = reports[1]
    assert isinstance(fill, Fill)
    assert fill.qty == 5 and fill.leaves_qty == 0
    # 3 @ +1 tick, 2 @ +2 ticks -> VWAP +1.4 ticks.
    assert fill.price == px(1.4)
    assert fill.fee == 10.0
    assert fill.fill_id == "o1.1"
    assert broker.open_orders() == []


def test_market_order_partial_fill_when_depth_runs_out() -> None:
    broker = _broker()
    broker.on_records(_book(0))
    broker.submit(_order("o1", "sell", 20, ts=0))
    reports = broker.advance(5 * MS)
    kinds = [type(r) for r in reports]
    assert kinds == [Ack, Fill, Cancelled]
    fill, cancelled = reports[1], reports[2]
    assert isinstance(fill, Fill) and isinstance(cancelled, Cancelled)
    assert fill.qty == 15 and fill.leaves_qty == 5
    assert cancelled.cancelled_qty == 5 and cancelled.reason == "no depth"
    assert [r.seq for r in reports] == [1, 2, 3]


def test_limit_order_rests_behind_the_queue_and_fills_on_trades() -> None:
    broker = _broker()
    broker.on_records(_book(0))
    broker.submit(_order("b1", "buy", 4, ts=0, order_type="limit", limit_price=px(-1)))
    reports = broker.advance(2 * MS)
    assert [type(r) for r in reports] == [Ack]  # rests: 5 contracts ahead at the bid
    # 3 trade at our price: queue ahead 5 -> 2, nothing for us yet.
    t1 = _book(3 * MS, action=ACTION_TRADE, price=px(-1), size=3)
    assert broker.on_records(t1) == []
    # 4 more trade: 2 ahead, 2 for us.
    t2 = _book(4 * MS, action=ACTION_TRADE, price=px(-1), size=4)
    (fill,) = broker.on_records(t2)
    assert isinstance(fill, Fill) and fill.qty == 2 and fill.price == px(-1) and fill.leaves_qty == 2
    # The ask comes down to our limit: the rest fills at the limit.
    crossed = record(ES, 5 * MS, [(px(-2), 5)], [(px(-1), 9)])
    (fill2,) = broker.on_records(crossed)
    assert isinstance(fill2, Fill) and fill2.qty == 2 and fill2.fill_id == "b1.2" and fill2.leaves_qty == 0
    assert broker.open_orders() == []


def test_marketable_limit_takes_only_levels_within_the_limit_then_rests() -> None:
    broker = _broker()
    broker.on_records(_book(0))
    broker.submit(_order("b1", "buy", 10, ts=0, order_type="limit", limit_price=px(2)))
    reports = broker.advance(2 * MS)
    assert [type(r) for r in reports] == [Ack, Fill]
    fill = reports[1]
    assert isinstance(fill, Fill) and fill.qty == 7 and fill.leaves_qty == 3
    assert [o.client_order_id for o in broker.open_orders()] == ["b1"]


def test_cancel_after_latency_and_too_late_cancel() -> None:
    broker = _broker()
    broker.on_records(_book(0))
    broker.submit(_order("b1", "buy", 1, ts=0, order_type="limit", limit_price=px(-5)))
    broker.advance(2 * MS)
    assert broker.cancel(CancelOrder(client_order_id="b1", ts_ns=3 * MS)) == []
    (cancelled,) = broker.advance(5 * MS)
    assert (
        isinstance(cancelled, Cancelled) and cancelled.cancelled_qty == 1 and cancelled.reason == "cancelled"
    )
    (again,) = broker.cancel(CancelOrder(client_order_id="b1", ts_ns=6 * MS))
    assert isinstance(again, Reject)


def test_invalid_orders_are_rejected_at_once() -> None:
    broker = _broker()
    (r1,) = broker.submit(NewOrder(client_order_id="x", instrument_id=9, side="buy", qty=1, ts_ns=0))
    assert isinstance(r1, Reject) and "unknown instrument" in r1.reason
    broker.submit(_order("o", "buy", 1, ts=0))
    (r2,) = broker.submit(_order("o", "buy", 1, ts=0))
    assert isinstance(r2, Reject) and "duplicate" in r2.reason


def test_order_without_a_book_is_cancelled_not_filled() -> None:
    broker = _broker()
    broker.submit(_order("o", "buy", 1, ts=0))
    reports = broker.advance(MS * 5)
    assert [type(r) for r in reports] == [Ack, Cancelled]


def test_quiet_batches_leave_each_book_at_its_instruments_last_record() -> None:
    nq = 1002
    broker = PaperBroker(BrokerConfig(latency_ms=1.0, fee_per_contract=0.0), [ES, nq])
    # No working orders: batches are kept by reference; NQ's last record is in the older one.
    older = np.concatenate(
        [record(nq, 1 * MS, [(px(-1), 1)], [(px(7), 1)]), record(ES, 2 * MS, [(px(-1), 1)], [(px(1), 1)])]
    )
    newer = np.concatenate([record(ES, 3 * MS, [(px(-1), 1)], [(px(2), 9)]) for _ in range(2)])
    assert broker.on_records(older) == [] and broker.on_records(newer) == []
    broker.submit(_order("es", "buy", 1, ts=3 * MS))
    broker.submit(NewOrder(client_order_id="nq", instrument_id=nq, side="buy", qty=1, ts_ns=3 * MS))
    fills = [r for r in broker.advance(5 * MS) if isinstance(r, Fill)]
    assert {f.client_order_id: f.price for f in fills} == {"es": px(2), "nq": px(7)}


def test_orders_of_two_instruments_in_one_batch_beside_one_never_seen() -> None:
    nq, cl = 1002, 1003
    broker = PaperBroker(BrokerConfig(latency_ms=1.0, fee_per_contract=0.0), [ES, nq, cl])
    first = np.concatenate(
        [record(ES, 1 * MS, [(px(-1), 1)], [(px(1), 1)]), record(nq, 1 * MS, [(px(-1), 1)], [(px(5), 1)])]
    )
    assert broker.on_records(first) == []
    for coid, inst in (("es", ES), ("nq", nq), ("cl", cl)):
        broker.submit(NewOrder(client_order_id=coid, instrument_id=inst, side="buy", qty=1, ts_ns=1 * MS))
    # Each order arrives at 2 ms and executes on its instrument's first record after that,
    # against the book before it: NQ's of 2 ms, ES's of 1 ms. CL never traded: no book.
    later = np.concatenate(
        [
            record(nq, 2 * MS, [(px(-1), 1)], [(px(6), 1)]),
            record(ES, 3 * MS, [(px(-1), 1)], [(px(2), 1)]),
            record(nq, 3 * MS, [(px(-1), 1)], [(px(7), 1)]),
        ]
    )
    fills = [r for r in broker.on_records(later) if isinstance(r, Fill)]
    assert {f.client_order_id: f.price for f in fills} == {"es": px(1), "nq": px(6)}
    closed = [r for r in broker.advance(5 * MS) if isinstance(r, Cancelled)]
    assert [(c.client_order_id, c.reason) for c in closed] == [("cl", "no book yet")]
