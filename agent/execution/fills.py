"""Fill and P&L maths shared by the paper broker, the replay backtest and the training environment.

DESIGN section 3: one implementation, two drivers. Every function is vectorised over a leading
batch axis and written against the array module of its inputs (NumPy or CuPy); the paper broker
calls it with a batch of one, the vectorised environment with thousands of windows at once.

Units
-----
* **price unit**: whatever linear unit the caller's prices are in: 1e-9 fixed-point integers
  straight from MBP-10 records, currency, or ticks. Outputs named ``*_price`` and every P&L named
  ``*_px`` are in that same unit (times contracts for P&L). :func:`to_currency` converts with the
  instrument's ``tick_size`` (in the price unit) and ``tick_value`` (currency per tick per
  contract).
* **ticks**: the training environment works in ticks (mid changes, half-spreads, fees converted
  with ``fee_per_contract / tick_value``).
* **quantities**: signed contracts, positive = buy / long.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from agent.execution.config import FillPrice
from agent.model.arrays import Array, array_module
from feeds.bars import decision_times
from feeds.config import BarConfig
from feeds.records import UNDEF_PRICE

__all__ = [
    "BookFill",
    "OrderSchedule",
    "PositionArrays",
    "apply_fills",
    "closers",
    "execution_price",
    "fees",
    "fill_costs_ticks",
    "late_orders",
    "order_schedule",
    "position_change_cost_ticks",
    "slippage_vs_mid",
    "step_pnl_ticks",
    "to_currency",
    "walk_book",
]


class BookFill(NamedTuple):
    """Result of :func:`walk_book`, one entry per order (all shape ``[B]``)."""

    filled: Array
    """Signed contracts filled (same sign as the request; smaller in size when depth ran out)."""
    avg_price: Array
    """Volume-weighted average fill price (float64, price unit); NaN where nothing filled."""


def walk_book(bid_px: Array, bid_sz: Array, ask_px: Array, ask_sz: Array, qty: Array) -> BookFill:
    """Fill market orders of signed size ``qty`` by walking the book levels.

    Args:
        bid_px, ask_px: ``[B, L]`` level prices, best first (price unit; int fixed-point or float).
        bid_sz, ask_sz: ``[B, L]`` level sizes (contracts).
        qty: ``[B]`` signed order sizes; a buy (``qty > 0``) consumes asks, a sell consumes bids.

    Levels with a non-positive size, an undefined price (``UNDEF_PRICE`` fixed point) or a
    non-finite price are empty. When depth runs out the order fills partially (no price is
    invented beyond the book). The average is computed relative to the best level's price, so
    1e-9 fixed-point prices keep full precision in float64.
    """
    xp = array_module(bid_px, ask_px, qty)
    q = xp.asarray(qty, dtype=np.float64)
    buy = (q > 0)[:, None]
    px = xp.where(buy, xp.asarray(ask_px), xp.asarray(bid_px))
    sz = xp.where(buy, xp.asarray(ask_sz), xp.asarray(bid_sz))
    has = px != UNDEF_PRICE if px.dtype.kind in "iu" else xp.isfinite(px)
    has &= sz > 0
    sz = xp.where(has, sz, 0.0)  # float64
    # take = min(max(|q| - depth before the level, 0), size), in one buffer (a batch walks
    # ~30 small arrays: each temporary not made is a share of the call)
    take = sz.cumsum(axis=1)
    take -= sz
    xp.subtract(xp.abs(q)[:, None], take, out=take)
    xp.maximum(take, 0.0, out=take)
    xp.minimum(take, sz, out=take)
    filled_abs = take.sum(axis=1)
    # Reference = the first non-empty level's price (exact in int64), offsets are small.
    ref = px[xp.arange(px.shape[0]), has.argmax(axis=1)]
    offset = xp.where(has, px - ref[:, None], 0.0)
    # NaN where nothing filled; divided by 1 there, not 0 (no 0/0 warning to silence: np.errstate
    # costs more than the division)
    some = filled_abs > 0
    avg = xp.where(some, ref + (take * offset).sum(axis=1) / xp.where(some, filled_abs, 1.0), np.nan)
    return BookFill(filled=xp.sign(q) * filled_abs, avg_price=avg)


def execution_price(fill: BookFill, best_bid: Array, best_ask: Array, rule: FillPrice) -> Array:
    """The price of each execution of :func:`walk_book` under the broker's fill rule
    (``broker.fill_price``), float64 in the price unit, NaN where nothing is filled.

    ``book``: the volume-weighted price of the levels taken (``fill.avg_price``). ``mid``: the
    control experiment without spread cost: the mid of the same book's best bid and ask
    (``best_bid``/``best_ask`` ``[B]``, level 0); NaN, so no fill, where the book is one-sided
    (there is no mid to fill at). The quantity is the book walk's in both cases. The paper broker
    and the vectorised backtest price fills with this; the training environment's costs follow
    the same rule (:func:`fill_costs_ticks`).
    """
    if rule == "book":
        return fill.avg_price
    xp = array_module(best_bid, best_ask)
    bid, ask = xp.asarray(best_bid), xp.asarray(best_ask)
    defined = (bid > 0) & (ask > 0)
    if bid.dtype.kind in "iu":
        defined &= (bid != UNDEF_PRICE) & (ask != UNDEF_PRICE)
    mid = 0.5 * (bid.astype(np.float64) + ask.astype(np.float64))
    return xp.where(defined & (fill.filled != 0), mid, np.nan)


def fill_costs_ticks(buy_cost_ticks: Array, sell_cost_ticks: Array, rule: FillPrice) -> tuple[Array, Array]:
    """What a buy pays above, and a sell gives up below, the decision bar's mid (ticks, ``[N]``)
    under the broker's fill rule, from the touch costs of the book the order meets (its ask
    minus the decision mid, the decision mid minus its bid).

    ``book``: those touch costs, unchanged. ``mid``: the order fills at that book's mid, which is
    ``(buy - sell) / 2`` above the decision mid: a buy pays that, a sell gives it up (zero when
    the mid did not move between the decision and the execution).
    """
    if rule == "book":
        return buy_cost_ticks, sell_cost_ticks
    moved = 0.5 * (buy_cost_ticks - sell_cost_ticks)
    return moved, -moved


def slippage_vs_mid(filled: Array, avg_price: Array, mid: Array) -> Array:
    """Cost of fills relative to the mid price, ``filled * (avg_price - mid)`` (price unit x
    contracts; positive = paid). A unit order at the top of the book costs half the spread.
    Zero where nothing filled."""
    xp = array_module(filled, avg_price, mid)
    cost = filled * (avg_price - mid)
    return xp.where(filled != 0, cost, 0.0)


def fees(filled: Array, fee_per_contract: float) -> Array:
    """Fees in currency for signed fill sizes: ``|filled| * fee_per_contract``."""
    xp = array_module(filled)
    return xp.abs(filled) * fee_per_contract


def position_change_cost_ticks(
    delta: Array, buy_cost_ticks: Array, sell_cost_ticks: Array, fee_ticks: Array | float
) -> Array:
    """Cost in ticks of changing a position by ``delta`` contracts, relative to the decision's mid.

    The training environment's execution model: a buy fills ``buy_cost_ticks`` above the
    decision bar's mid, a sell ``sell_cost_ticks`` below it (:func:`fill_costs_ticks`: the ask
    and bid of the book the order meets, or that book's mid under ``fill_price = "mid"``), and
    every contract pays ``fee_ticks = fee_per_contract / tick_value``. With the book the paper
    broker's order meets (the one at arrival + latency, :func:`order_schedule`) this equals
    :func:`slippage_vs_mid` of the broker's fill (in ticks) plus :func:`fees` whenever the top
    level holds ``|delta|`` contracts; deeper walks cost more (the broker charges them).
    """
    xp = array_module(delta, buy_cost_ticks)
    side_cost = xp.where(delta > 0, buy_cost_ticks, sell_cost_ticks)
    return xp.abs(delta) * (side_cost + fee_ticks)


class OrderSchedule(NamedTuple):
    """When the orders of an instrument's bars execute (:func:`order_schedule`), per bar."""

    rows: np.ndarray[Any, Any]
    """The index in ``records`` of the book the bar's order meets."""
    late: np.ndarray[Any, Any]
    """Whether the order would still be waiting when the next bar is decided."""
    decided_ns: np.ndarray[Any, Any]
    """When the bar is decided and its order placed (:func:`feeds.bars.decision_times`)."""


def order_schedule(
    records: np.ndarray[Any, Any],
    instrument_id: int,
    close_index: Array,
    close_ts: Array,
    latency_ms: float,
    *,
    bars: BarConfig,
    grace_ns: int,
) -> OrderSchedule:
    """Per bar, the book its order meets as the paper broker has it, and whether that order is
    late. ``close_index`` and ``close_ts``: the bars' last record indices and close times
    (:attr:`feeds.features.BarFrame.close_index`, ``ts_close``) on the ``bars`` clock;
    ``grace_ns``: ``daemon.close_grace_ns``.

    The bar is decided at :func:`feeds.bars.decision_times` of its closer (a time bar's first
    record after it, an event bar's own last record; clocks are the instrument's running maximum
    of ``ts_recv``): at the closer, or on the clock a grace after a quiet time bar's close. Its
    order, placed then, meets the instrument's last record with ``ts_recv <= decided + latency``.
    The broker executes it at the instrument's first record after that arrival, or when the
    clock closes a bar past it (the intake moves the paper book's clock then), so it is late
    unless it arrives before the next bar is decided (:func:`late_orders`)."""
    mine = np.flatnonzero(records["instrument_id"] == instrument_id)
    ts = np.maximum.accumulate(records["ts_recv"][mine].astype(np.int64))
    closer = ts[np.minimum(closers(mine, close_index, bars), mine.shape[0] - 1)]
    decided = decision_times(closer, np.asarray(close_ts, dtype=np.int64), bars, grace_ns)
    latency_ns = round(latency_ms * 1_000_000)
    return OrderSchedule(
        rows=mine[np.searchsorted(ts, decided + latency_ns, side="right") - 1],
        late=late_orders(decided, latency_ns),
        decided_ns=decided,
    )


def closers(
    indices: np.ndarray[Any, Any], close_index: np.ndarray[Any, Any], bars: BarConfig
) -> np.ndarray[Any, Any]:
    """Where each bar's closer is among an instrument's record ``indices`` (ascending; the
    result is ``len(indices)`` where it has not come yet): a time bar's first record after its
    ``close_index``, an event bar's record at it (an event bar closes on its own last record)."""
    at: np.ndarray[Any, Any] = np.searchsorted(
        indices, close_index, side="right" if bars.clock == "time" else "left"
    )
    return at


def late_orders(decided_ns: np.ndarray[Any, Any], latency_ns: int) -> np.ndarray[Any, Any]:
    """:attr:`OrderSchedule.late` of an instrument's bars from when they are decided (int64
    ``[bars]``): an order placed at ``decided_ns`` arrives ``latency_ns`` later and is late
    unless that is before the next bar is decided (by its closer, which executes the order, or
    by the clock, which moves the paper book's clock first; the last bar has no next decision:
    never late)."""
    late = np.zeros(decided_ns.shape[0], dtype=bool)
    late[:-1] = decided_ns[:-1] + latency_ns >= decided_ns[1:]
    return late


def step_pnl_ticks(
    pos_prev: Array,
    pos_new: Array,
    mark_now: Array,
    mark_next: Array,
    *,
    buy_cost_ticks: Array,
    sell_cost_ticks: Array,
    fee_ticks: Array | float,
) -> tuple[Array, Array]:
    """Mark-to-market P&L in ticks of one decision step, as ``(gross, cost)``.

    At the decision bar the position moves from ``pos_prev`` to ``pos_new`` (cost charged by
    :func:`position_change_cost_ticks`), then it is held until the next bar:
    ``gross = pos_new * (mark_next - mark_now)``. Summed over a path, ``gross - cost`` equals the
    realised + unrealised P&L of :class:`PositionArrays` minus fees (:func:`apply_fills` filling
    at mid + buy cost or mid - sell cost), which the tests check.
    """
    gross = pos_new * (mark_next - mark_now)
    cost = position_change_cost_ticks(pos_new - pos_prev, buy_cost_ticks, sell_cost_ticks, fee_ticks)
    return gross, cost


class PositionArrays(NamedTuple):
    """Vectorised position accounting, one entry per account/instrument (all shape ``[B]``); the
    in-memory counterpart of the SQL ledger's positions (:class:`storage.Ledger`).

    ``avg_price`` is the average entry price of the open position (price unit; 0 when flat);
    ``realised_px`` the realised P&L in price unit x contracts (before fees).
    """

    position: Array
    avg_price: Array
    realised_px: Array

    @classmethod
    def flat(cls, n: int, xp: ModuleType = np) -> PositionArrays:
        """``n`` flat positions on the array module ``xp``."""
        return cls(xp.zeros(n), xp.zeros(n), xp.zeros(n))


def apply_fills(positions: PositionArrays, qty: Array, price: Array) -> PositionArrays:
    """Book fills of signed size ``qty`` at ``price`` (``[B]`` each; ``qty == 0`` is a no-op).

    Increasing a position averages the entry price; reducing it realises
    ``closed * (price - avg_price)``; crossing through zero realises the whole old position and
    opens the remainder at ``price``.
    """
    xp = array_module(positions.position, qty, price)
    pos, avg, realised = positions
    q = xp.asarray(qty, dtype=np.float64)
    none = q == 0
    p = xp.where(none, 0.0, xp.asarray(price, dtype=np.float64))
    new_pos = pos + q
    side, size, held = xp.sign(pos), xp.abs(q), xp.abs(pos)
    increasing = (pos == 0) | (xp.sign(q) == side)
    closed = xp.where(increasing, 0.0, side * xp.minimum(size, held))
    realised = realised + closed * (p - avg)
    flat = new_pos == 0
    averaged = (pos * avg + q * p) / xp.where(flat, 1.0, new_pos)  # flat: replaced below
    # Reducing keeps the entry price, crossing through zero opens at p; a no-op (q == 0, so
    # not increasing unless flat) keeps it too, and so does a flat no-op (new_pos == 0).
    new_avg = xp.where(increasing, averaged, xp.where(size > held, p, avg))
    new_avg = xp.where(flat, xp.where(none, avg, 0.0), new_avg)
    return PositionArrays(new_pos, new_avg, realised)


def to_currency(pnl_px: Array, tick_size: float, tick_value: float) -> Array:
    """Convert P&L in price unit x contracts into currency: ``pnl / tick_size * tick_value``."""
    return pnl_px / tick_size * tick_value
