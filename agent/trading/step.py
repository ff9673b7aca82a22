"""One trading step: observation -> decision -> size -> risk -> order (DESIGN section 3).

The daemon (:mod:`agent.daemon.app`), the event-driven backtest (:mod:`agent.backtest.event`)
and, through it, the trainer's as-traded evaluation of each fold run this class, so what the
promotion gate scores is what the daemon trades. The vectorised backtest
(:mod:`agent.backtest.fast`) applies the same rules on arrays and a parity test holds the two
together.

A step, for the bars that closed together (one per instrument):

1. the regime trackers advance with each tradable bar's mid log-return (NaN keeps the state);
2. the observation rows are built from the bar's features and the instrument's position and
   entry price (:func:`agent.policy.observation.agent_feature_values`, row by row);
3. the decider picks the action (``policy.selection``) and sizes it (Kelly x regime, the
   instrument's round-trip cost: :mod:`agent.policy.kelly`), one batched call;
4. :meth:`TradingStep.order_for` turns a valid target into an order: none while blocked (a halt,
   a stop, a flatten), nor on a book that fails the record health rules now; the target is
   clamped to ``risk.max_position``, the order is the difference to position plus working
   orders, and the order-rate limit counts it;
5. once the round's orders are out, :meth:`TradingStep.check_risk` checks the daily-loss and
   drawdown limits on the same clock: a breach is flattened (:meth:`TradingStep.flatten`, one
   step a round until flat) and latched as a halt by the caller.

The loss check belongs to the decision round, not to a timer: equity moves only with the marks
(a bar close) and the fills (applied before the next round), so a check after every round sees
every level the equity reaches at a decision; a wall-clock timer would see a different subset
in every replay, and the daemon and the backtest would halt at different bars.

The clock and the venue are injected: each call takes the time it happens at (the feed clock in
a replay or a backtest, the wall clock live) and the step cancels working limit orders through
the ``cancel`` callable it was given. It never sends an order itself: the caller records it in
the ledger and sends it the way its venue needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from agent.config import Config
from agent.execution.orders import OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import CancelOrder, NewOrder, Side
from agent.policy.observation import AGENT_FEATURES, agent_feature_values
from agent.policy.regime import RegimeTracker
from agent.trading.decider import Decided, Decider
from agent.trading.risk import RiskLimits
from feeds.book import tick_fixed
from feeds.config import InstrumentSpec
from feeds.features import FEATURE_NAMES, BarFrame, IncrementalFeatures
from feeds.health import fault_mask
from feeds.records import PRICE_SCALE, UNDEF_PRICE

__all__ = ["BarClose", "Step", "TradingStep", "decision_rounds"]

_LOGRET = FEATURE_NAMES.index("mid_logret")


@dataclass(frozen=True, slots=True)
class BarClose:
    """Row ``row`` of ``frame``: one closed bar of one instrument."""

    frame: BarFrame
    row: int

    @property
    def instrument_id(self) -> int:
        return self.frame.instrument_id


_Item = TypeVar("_Item")


def decision_rounds(
    items: Iterable[_Item], frame_of: Callable[[_Item], BarFrame]
) -> list[list[tuple[_Item, BarClose, bool]]]:
    """The rounds in which closed bars are decided (the daemon's decision task, its replay and
    the event-driven backtest): round r holds the r-th pending bar of every instrument (the bars
    of its ``items``' frames, in order; instruments in the order they first appear), each with
    the item it came from and whether it is the instrument's last pending bar, the only one
    that may send an order. A round is one :meth:`TradingStep.decide` and ends with
    :meth:`TradingStep.check_risk`."""
    pending: dict[int, list[tuple[_Item, BarClose]]] = {}
    for item in items:
        frame = frame_of(item)
        bars = pending.setdefault(frame.instrument_id, [])
        bars.extend((item, BarClose(frame, r)) for r in range(len(frame)))
    rounds = max(map(len, pending.values()), default=0)
    if rounds == 1:  # the usual step: at most one bar an instrument, one round
        return [[(item, close, True) for bars in pending.values() for item, close in bars]]
    return [
        [(bars[k][0], bars[k][1], k == len(bars) - 1) for bars in pending.values() if k < len(bars)]
        for k in range(rounds)
    ]


@dataclass(frozen=True, slots=True)
class Step:
    """What one step decided, row by row in the order of its closes."""

    slots: npt.NDArray[np.int64]
    """Instrument index (position in the step's instrument list) per row."""
    decided: Decided
    regime: npt.NDArray[np.float64]
    """Regime tracker scale per row (before the sizing's clamp to [scale_floor, 1])."""
    positions: npt.NDArray[np.int64]
    """Position per row before the decision."""


class TradingStep:
    """The trading step for ``specs`` (one decider slot per instrument, in ``specs`` order).

    ``floors`` are the learned regime floors per instrument. ``portfolio`` and ``orders`` are the
    caller's books (it applies fills and reports to them); ``features`` is the caller's
    incremental feature builder, read for the book an order would meet.
    """

    def __init__(
        self,
        config: Config,
        specs: Sequence[InstrumentSpec],
        floors: Sequence[float],
        *,
        portfolio: Portfolio,
        orders: OrderManager,
        features: IncrementalFeatures,
        cancel: Callable[[CancelOrder], None],
    ) -> None:
        self.config = config
        self.specs = list(specs)
        self.slot = {s.instrument_id: i for i, s in enumerate(self.specs)}
        self._tick_px = [float(tick_fixed(s.tick_size)) for s in self.specs]
        """Tick per instrument index in 1e-9 fixed point (entry prices in ticks)."""
        self._tick_fixed = {s.instrument_id: tick_fixed(s.tick_size) for s in self.specs}
        """Tick per instrument id, as the Python int the record rules take (:meth:`book_ok`)."""
        self.regime = RegimeTracker(config.regime, config.policy.scale_floor, list(floors))
        self.risk = RiskLimits(config.risk)
        self.portfolio = portfolio
        self.orders = orders
        self.features = features
        self.cancel = cancel
        self.marks: dict[int, float] = {}
        """Last trusted bar-close mid per instrument, 1e-9 fixed point (unrealised P&L)."""
        self.blocked_by_book = 0
        """Orders not sent because the instrument's book failed the health rules."""

    def track(self, closes: Sequence[BarClose]) -> npt.NDArray[np.float64]:
        """Step 1 alone (also while no model serves, so that the trackers stay warm): the
        regime scale per close, and the marks of the tradable ones."""
        return np.asarray(self._track(closes, self._slots(closes)), dtype=np.float64)

    def _slots(self, closes: Sequence[BarClose]) -> list[int]:
        """The instrument index of each close."""
        slot = self.slot
        return [slot[c.frame.instrument_id] for c in closes]

    def _track(self, closes: Sequence[BarClose], slots: list[int]) -> list[float]:
        """:meth:`track` of ``closes`` at their instrument indices ``slots``."""
        logret = []
        for close in closes:
            frame, r = close.frame, close.row
            if frame.tradable[r]:
                logret.append(float(frame.features[r, _LOGRET]))
                self.marks[frame.instrument_id] = float(frame.mid_price[r]) * PRICE_SCALE
            else:
                logret.append(math.nan)
        return self.regime.update_at(slots, logret)

    def decide(self, closes: Sequence[BarClose], decider: Decider) -> Step:
        """Steps 1-3 for bars of distinct instruments that closed together. The rows' inputs are
        gathered in one pass over the closes, as Python values (a NumPy call per close costs
        more than the values it would hold)."""
        slot_of = self._slots(closes)
        scale = self._track(closes, slot_of)
        portfolio = self.portfolio
        n_market = len(FEATURE_NAMES)
        rows = np.empty((len(closes), n_market + len(AGENT_FEATURES)), dtype=np.float32)
        held, agent, healthy = [], [], []
        reward_scale = self.config.train.reward_scale
        for j, (i, close) in enumerate(zip(slot_of, closes, strict=True)):
            frame, r = close.frame, close.row
            iid = frame.instrument_id
            rows[j, :n_market] = frame.features[r]
            position = portfolio.position(iid)
            held.append(position)
            entry_ticks = portfolio.avg_price(iid) / self._tick_px[i]
            agent.append(agent_feature_values(position, entry_ticks, float(frame.mid_ticks[r]), reward_scale))
            healthy.append(bool(frame.tradable[r]))
        rows[:, n_market:] = agent
        slots = np.asarray(slot_of, dtype=np.int64)
        regime = np.asarray(scale, dtype=np.float64)
        positions = np.asarray(held, dtype=np.int64)
        decided = decider.decide(slots, rows, positions, regime, np.asarray(healthy))
        return Step(slots=slots, decided=decided, regime=regime, positions=positions)

    def order_for(
        self, close: BarClose, target: int, *, now_ns: int, blocked: bool, wall_ns: int = 0
    ) -> NewOrder | None:
        """Step 4: the order moving ``close``'s instrument to ``target`` (risk-clamped), or None.

        Market orders walk the book. Limit orders (``broker.order_type = "limit"``) join the
        near touch of the bar's close (bid for a buy, ask for a sell); when the target moves
        while orders of the instrument still work, they are cancelled first and the new order
        waits for the next bar, so working and new orders never add up past the target.
        ``now_ns`` is the step's clock (the order's time and the order-rate window);
        ``wall_ns`` is when it leaves this process (the acknowledgement timeout's clock).
        """
        iid = close.instrument_id
        if blocked or not self.book_ok(iid):
            return None
        delta = self.risk.clamp(target) - (self.portfolio.position(iid) + self.orders.working(iid))
        limit = self.config.broker.order_type == "limit"
        if delta == 0 or (limit and self._cancel_working(iid, now_ns)):
            return None
        if not self.risk.order_allowed(now_ns / 1e9):
            return None
        side: Side = "buy" if delta > 0 else "sell"
        price = None
        if limit:
            frame, r = close.frame, close.row
            touch = float(frame.bid_price[r] if side == "buy" else frame.ask_price[r])
            if not touch > 0:
                return None
            price = round(touch * PRICE_SCALE)
        self.risk.order_sent(now_ns / 1e9)
        return self.orders.new(
            iid,
            side,
            abs(delta),
            ts_ns=now_ns,
            order_type="limit" if limit else "market",
            limit_price=price,
            wall_ns=wall_ns,
        )

    def book_ok(self, iid: int) -> bool:
        """The instrument's book *now* (its last record, which may be later than the bar close
        the decision used) passes the record health rules: present, not crossed, sane prices."""
        book = self.features.by_id[iid].book()
        if book is None:
            return False
        faults = fault_mask(
            bid=book.bid_px[0],
            ask=book.ask_px[0],
            bid_sz=book.bid_sz[0],
            ask_sz=book.ask_sz[0],
            trade_price=1,
            ts=book.ts_recv,
            clock_before=book.ts_recv,
            seq=0,
            seq_before=0,
            bid_before=UNDEF_PRICE,
            ask_before=UNDEF_PRICE,
            tick=self._tick_fixed[iid],
            config=self.config.feeds.health,
        )
        if faults:
            self.blocked_by_book += 1
        return not faults

    def _cancel_working(self, iid: int, now_ns: int) -> bool:
        """Cancel the working orders of ``iid``; True when there were some (wait for them)."""
        entries = self.orders.open_orders(iid)
        for entry in entries:
            if not entry.cancel_sent:
                entry.cancel_sent = True
                self.cancel(CancelOrder(client_order_id=entry.order.client_order_id, ts_ns=now_ns))
        return bool(entries)

    def cancel_all(self, now_ns: int) -> int:
        """Cancel every open order (once each); the number of cancels sent."""
        sent = 0
        for entry in self.orders.open_orders():
            if not entry.cancel_sent:
                entry.cancel_sent = True
                self.cancel(CancelOrder(client_order_id=entry.order.client_order_id, ts_ns=now_ns))
                sent += 1
        return sent

    def equity(self) -> float:
        """Realised plus unrealised P&L at the last trusted marks (currency)."""
        return self.portfolio.realised() + self.portfolio.unrealised(self.marks)

    def check_risk(self, now_ns: int, *, latched: bool) -> str | None:
        """Step 5, after every decision round at the round's time ``now_ns`` (the feed clock in a
        replay or a backtest): the daily loss and drawdown of :meth:`equity` against the limits.
        Returns the breach the caller acts on (flatten and latch a risk halt), or None: none, or
        a risk halt already ``latched`` (the day and the peak still follow the equity)."""
        if latched:
            self.risk.observe(self.equity(), now_ns)
            return None
        return self.risk.breach(self.equity(), now_ns)

    def flatten(self, now_ns: int, wall_ns: int = 0) -> list[NewOrder] | None:
        """One flatten step: cancel the open orders first (an empty list: wait for their
        reports), then a market order closing each position; None once flat."""
        if self.orders.open_orders():
            self.cancel_all(now_ns)
            return []
        if self.portfolio.flat:  # the usual case: a halt keeps asking once flat
            return None
        positions = {iid: q for iid, q in self.portfolio.positions().items() if q}
        return [
            self.orders.new(iid, "sell" if q > 0 else "buy", abs(q), ts_ns=now_ns, wall_ns=wall_ns)
            for iid, q in positions.items()
        ]

    def status(self) -> dict[str, Any]:
        """Counters for status reports."""
        return {"orders_blocked_by_book": self.blocked_by_book, "throttled_orders": self.risk.throttled}
