from __future__ import annotations

import math

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from storage import Database, Ledger, apply_fill
from storage.errors import InvalidRecord, NotFound
from storage.ledger import LedgerWrite, OrderUpdate
from storage.values import FillsResult, LedgerFill, LedgerOrder, PositionState

PX = 1_000_000_000  # one price unit in DBN fixed point


def order(
    cid: str, side: str = "buy", qty: int = 2, instrument: int = 1001, account: str = "default"
) -> LedgerOrder:
    return LedgerOrder(
        client_order_id=cid, instrument_id=instrument, side=side, qty=qty, ts_ns=1, account=account
    )  # type: ignore[arg-type]


def fill(fid: str, cid: str, qty: int = 1, price: float = 5000.0, fee: float = 0.5) -> LedgerFill:
    return LedgerFill(fill_id=fid, client_order_id=cid, qty=qty, price=round(price * PX), ts_ns=2, fee=fee)


def test_orders_are_idempotent_and_a_reused_id_is_refused(db: Database) -> None:
    ledger = Ledger(db)
    assert ledger.record_orders([order("a"), order("b")]) == ("a", "b")
    assert ledger.record_orders([order("a"), order("c")]) == ("c",)
    assert ledger.record_order(order("a")).status == "new"
    with pytest.raises(InvalidRecord, match="already used by a different order"):
        ledger.record_orders([order("d"), order("a", qty=5)])
    with pytest.raises(NotFound):
        ledger.order("d")  # the whole batch was refused
    assert len(ledger.open_orders()) == 3


@pytest.mark.parametrize(
    "bad",
    [
        LedgerOrder(client_order_id="x", instrument_id=1001, side="buy", qty=0, ts_ns=1),
        LedgerOrder(client_order_id="", instrument_id=1001, side="buy", qty=1, ts_ns=1),
        LedgerOrder(client_order_id="x", instrument_id=1001, side="buy", qty=1, ts_ns=1, order_type="limit"),
        LedgerOrder(client_order_id="x", instrument_id=1001, side="buy", qty=1, ts_ns=1, limit_price=5),
        LedgerOrder(client_order_id="x", instrument_id=9999, side="buy", qty=1, ts_ns=1),
        LedgerOrder(client_order_id="x", instrument_id=1001, side="buy", qty=1.5, ts_ns=1),  # type: ignore[arg-type]
        LedgerOrder(client_order_id="x", instrument_id=1001, side="buy", qty=1, ts_ns=1, order_type="stop"),  # type: ignore[arg-type]
    ],
)
def test_bad_orders_are_refused(db: Database, bad: LedgerOrder) -> None:
    with pytest.raises(InvalidRecord):
        Ledger(db).record_orders([bad])


def test_same_fill_twice_is_stored_once_and_counted_once(db: Database) -> None:
    ledger = Ledger(db)
    ledger.record_orders([order("a", qty=3)])
    first = ledger.record_fills([fill("f1", "a"), fill("f2", "a")])
    assert first.inserted == ("f1", "f2") and first.duplicates == ()
    again = ledger.record_fills([fill("f2", "a"), fill("f1", "a"), fill("f3", "a"), fill("f3", "a")])
    assert again.inserted == ("f3",) and set(again.duplicates) == {"f1", "f2"}
    assert ledger.count_fills() == 3
    stored = ledger.order("a")
    assert (stored.filled_qty, stored.status) == (3, "filled")
    position = ledger.positions()[1001]
    assert position.qty == 3 and position.fees == pytest.approx(1.5)
    assert ledger.open_orders() == []


@pytest.mark.parametrize(
    ("fills", "message"),
    [
        ([fill("f1", "nope")], "unknown orders"),
        ([fill("f1", "a", qty=3)], "over-fills"),
        ([fill("f1", "a", fee=math.nan)], "finite"),
        ([fill("f1", "a", qty=0)], "qty must be > 0"),
        ([fill("f1", "a"), fill("f1", "a", qty=2)], "twice in the batch"),
        ([LedgerFill(fill_id="f1", client_order_id="a", qty=1, price=2**63 - 1, ts_ns=1)], "undefined price"),
        ([LedgerFill(fill_id="f1", client_order_id="a", qty=1, price=5000.25, ts_ns=1)], "integers"),  # type: ignore[arg-type]
    ],
)
def test_bad_fills_are_refused_and_nothing_is_stored(
    db: Database, fills: list[LedgerFill], message: str
) -> None:
    ledger = Ledger(db)
    ledger.record_orders([order("a", qty=2)])
    with pytest.raises(InvalidRecord, match=message):
        ledger.record_fills([fill("ok", "a"), *fills])
    assert ledger.count_fills() == 0
    assert ledger.order("a").filled_qty == 0
    assert ledger.positions() == {}
    assert ledger.record_fills([]) == FillsResult(inserted=(), duplicates=())


def test_a_fill_id_reused_with_other_content_is_refused(db: Database) -> None:
    ledger = Ledger(db)
    ledger.record_orders([order("a", qty=2)])
    ledger.record_fills([fill("f1", "a", price=5000.0)])
    with pytest.raises(InvalidRecord, match="different content"):
        ledger.record_fills([fill("f1", "a", price=5001.0)])


def test_order_updates_and_terminal_states(db: Database) -> None:
    ledger = Ledger(db)
    ledger.record_orders([order("a", qty=2), order("b")])
    assert ledger.update_order("a", "acked", ts_ns=5).status == "acked"
    ledger.record_fills([fill("f1", "a")])
    assert ledger.update_order("a", "acked", ts_ns=6).status == "partially_filled"
    assert ledger.update_order("a", "cancelled", ts_ns=7, reason="user").status == "cancelled"
    late = ledger.record_fills([fill("f2", "a")])  # a fill that crossed the cancel is still real
    assert late.inserted == ("f2",)
    assert ledger.order("a").status == "cancelled" and ledger.order("a").filled_qty == 2
    assert ledger.update_order("b", "rejected", ts_ns=8, reason="risk").reason == "risk"
    assert ledger.update_order("b", "acked", ts_ns=9).status == "rejected"
    with pytest.raises(InvalidRecord):
        ledger.update_order("b", "filled", ts_ns=9)
    with pytest.raises(InvalidRecord):
        ledger.update_order("zz", "acked", ts_ns=9)


def _writes(prefix: str, account: str) -> list[LedgerWrite]:
    def o(cid: str, side: str, qty: int) -> LedgerOrder:
        return order(prefix + cid, side, qty, account=account)

    def f(fid: str, cid: str, price: float) -> LedgerFill:
        return fill(prefix + fid, prefix + cid, price=price)

    return [
        o("a", "buy", 2),
        f("f1", "a", 5000.0),
        o("b", "sell", 2),
        OrderUpdate(prefix + "b", "rejected", 3, "risk"),
        f("f2", "a", 5002.0),
        f("f2", "a", 5002.0),  # the same fill twice is one
        o("c", "sell", 1),
        OrderUpdate(prefix + "c", "acked", 4),
        f("f3", "c", 5010.0),
        OrderUpdate(prefix + "c", "cancelled", 5, "late"),  # after its fill: the terminal state stays
    ]


def _state(ledger: Ledger, prefix: str, account: str) -> tuple[object, ...]:
    orders = [ledger.order(prefix + cid) for cid in "abc"]
    return (
        [(o.status, o.filled_qty, o.reason, o.ts_updated_ns) for o in orders],
        [(f.fill_id[len(prefix) :], f.qty, f.price) for f in ledger.fills(account=account)],
        ledger.positions(account),
    )


def test_record_makes_each_write_in_its_order_in_one_transaction(db: Database) -> None:
    ledger = Ledger(db)
    ledger.record(_writes("", "default"))
    for w in _writes("s", "solo"):  # the same writes, one call each
        if isinstance(w, LedgerOrder):
            ledger.record_orders([w])
        elif isinstance(w, LedgerFill):
            ledger.record_fills([w])
        else:
            ledger.update_order(w.client_order_id, w.status, ts_ns=w.ts_ns, reason=w.reason)
    batched, single = _state(ledger, "", "default"), _state(ledger, "s", "solo")
    assert batched[:2] == single[:2]
    # c: acked at 4, filled at 2 (the later stamp stays), the cancel after its fill changes nothing.
    assert batched[0] == [("filled", 2, None, 2), ("rejected", 0, "risk", 3), ("filled", 1, None, 4)]
    positions = [
        {i: (p.qty, p.avg_price, p.realized_points) for i, p in b[2].items()} for b in (batched, single)
    ]
    assert positions[0] == positions[1] and positions[0][1001][0] == 1
    # All or nothing: a batch with a fill the ledger refuses stores none of its writes.
    with pytest.raises(InvalidRecord, match="over-fills"):
        ledger.record([order("d", qty=1), fill("f9", "d"), fill("f10", "d")])
    with pytest.raises(NotFound):
        ledger.order("d")
    with pytest.raises(InvalidRecord, match="set by fills"):
        ledger.record([OrderUpdate("a", "filled", 9)])
    ledger.record([])


def test_positions_follow_average_cost_accounting_per_account(db: Database) -> None:
    ledger = Ledger(db)
    ledger.record_orders(
        [
            order("b1", "buy", 2),
            order("b2", "buy", 2),
            order("s1", "sell", 5),
            order("x", "buy", 1, account="other"),
        ]
    )
    ledger.record_fills([fill("1", "b1", 2, 100.0, 1.0), fill("2", "b2", 2, 102.0, 1.0)])
    assert ledger.positions()[1001].avg_price == pytest.approx(101.0)
    ledger.record_fills([fill("3", "s1", 5, 105.0, 2.0), fill("4", "x", 1, 7.0, 0.0)])
    mine = ledger.positions()[1001]
    assert (mine.qty, mine.avg_price, mine.realized_points, mine.fees) == (
        -1,
        pytest.approx(105.0),
        pytest.approx(16.0),
        pytest.approx(4.0),
    )
    assert ledger.positions("other")[1001].qty == 1


def test_apply_fill_reduces_closes_and_flips() -> None:
    flat = PositionState(account="a", instrument_id=1)
    long3 = apply_fill(flat, side="buy", qty=3, price=10 * PX, fee=0.0, ledger_id=1)
    reduced = apply_fill(long3, side="sell", qty=1, price=12 * PX, fee=0.0, ledger_id=2)
    assert (reduced.qty, reduced.avg_price, reduced.realized_points) == (2, 10.0, 2.0)
    closed = apply_fill(reduced, side="sell", qty=2, price=9 * PX, fee=0.0, ledger_id=3)
    assert (closed.qty, closed.avg_price, closed.realized_points) == (0, 0.0, 0.0)
    short = apply_fill(long3, side="sell", qty=5, price=11 * PX, fee=1.0, ledger_id=4)
    assert (short.qty, short.avg_price, short.realized_points, short.fees, short.last_fill_id) == (
        -2,
        11.0,
        3.0,
        1.0,
        4,
    )


def test_rebuild_recomputes_from_fills_and_repairs_the_tables(db: Database) -> None:
    ledger = Ledger(db)
    ledger.record_orders([order("a", "buy", 3), order("b", "sell", 1), order("c", "buy", 1)])
    ledger.record_fills([fill("1", "a", 2, 100.0), fill("2", "b", 1, 101.0), fill("3", "a", 1, 103.0)])
    expected = ledger.positions()
    assert ledger.rebuild().positions == expected

    def tamper(session: Session) -> None:
        session.execute(text("UPDATE positions SET qty = 99"))
        session.execute(text("UPDATE orders SET filled_qty = 0, status = 'new' WHERE client_order_id = 'a'"))

    db.write(tamper, what="tamper")
    state = ledger.rebuild()
    assert state.positions == expected
    assert [o.client_order_id for o in state.open_orders] == ["c"]
    assert ledger.positions() == expected
    assert ledger.order("a").filled_qty == 3 and ledger.order("a").status == "filled"


def test_fills_page_in_recording_order(db: Database) -> None:
    ledger = Ledger(db)
    ledger.record_orders([order(f"o{i}", qty=1) for i in range(5)])
    ledger.record_fills([fill(f"f{i}", f"o{i}") for i in range(5)])
    first = ledger.fills(limit=3)
    rest = ledger.fills(after_id=first[-1].id)
    assert [f.fill_id for f in first + rest] == [f"f{i}" for i in range(5)]
    assert first[0].instrument_id == 1001 and first[0].side == "buy" and first[0].price == 5000 * PX
