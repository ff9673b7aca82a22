"""Hard risk limits and the halt state of the daemon (DESIGN section 7).

Two kinds of halt stop new orders:

* **latched** halts (``risk``, ``operator``, ``inference``): stay until an operator sends
  ``tradeagent ctl resume``; ``risk`` and ``operator`` halts are persisted as events, so a
  restarted daemon starts halted;
* **conditions** (``database``, ``venue``, ``model``): clear by themselves when the database,
  the gateway or a model is back.

Limits checked before every order: the target position is clamped to ``max_position``; at most
``max_orders_per_minute`` orders in any rolling 60 s; a day loss (realised + unrealised since
the start of the UTC day, or of the session when it started later) beyond ``max_daily_loss``,
or a fall from the session's equity peak beyond ``max_drawdown``, is a breach: the daemon
flattens every position and latches a ``risk`` halt. The breach is checked after every decision
round on the feed clock (:meth:`agent.trading.step.TradingStep.check_risk`), in the daemon as in
the event-driven backtest.

:func:`first_binding` replays a recorded path (order times, equity after each decision) through
the same limits: the vectorised backtest, which cannot halt spans in lockstep, uses it to
refuse a run in which a limit would have acted.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from agent.trading.config import RiskConfig

__all__ = ["LATCHED", "HaltKind", "Halts", "RiskLimits", "first_binding"]

HaltKind = Literal["risk", "operator", "inference", "database", "venue", "model"]
LATCHED: frozenset[str] = frozenset({"risk", "operator", "inference"})

_DAY_NS = 86_400 * 1_000_000_000


class Halts:
    """The set of active halts (kind -> reason); orders flow only when it is empty."""

    def __init__(self) -> None:
        self.active: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.active)

    def set(self, kind: HaltKind, reason: str) -> bool:
        """Add a halt; True when it was not already active."""
        new = kind not in self.active
        self.active[kind] = reason
        return new

    def clear(self, kind: HaltKind) -> bool:
        """Remove one halt; True when it was active."""
        return self.active.pop(kind, None) is not None

    def resume(self) -> list[str]:
        """Operator resume: clears the latched halts; conditions stay until they clear."""
        cleared = [k for k in self.active if k in LATCHED]
        for kind in cleared:
            del self.active[kind]
        return cleared

    def describe(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in sorted(self.active.items())) or "trading"


class RiskLimits:
    """Per-order checks and the P&L breaker. Clocks are passed in (feed or wall clock)."""

    def __init__(self, config: RiskConfig) -> None:
        self.config = config
        self._sent: collections.deque[float] = collections.deque()
        self._day = -1
        self._day_start_equity = 0.0
        self._peak = 0.0
        self.throttled = 0
        """Orders not sent because of the order-rate limit."""

    def clamp(self, target: int) -> int:
        """The target position within +/- ``max_position`` contracts (on a Python int: one
        decision's order, where an array call would cost more than the rest of the check)."""
        limit = self.config.max_position
        return max(-limit, min(limit, int(target)))

    def clamp_targets(self, targets: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """:meth:`clamp` of every target of an array (the vectorised backtest's rows)."""
        limit = self.config.max_position  # minimum and maximum: np.clip's wrapper costs as much again
        return np.minimum(np.maximum(np.asarray(targets, dtype=np.int64), -limit), limit)

    def order_allowed(self, now_s: float | None = None) -> bool:
        """Whether one more order fits the rolling 60 s rate limit (counts refusals)."""
        now = time.monotonic() if now_s is None else now_s
        while self._sent and now - self._sent[0] >= 60.0:
            self._sent.popleft()
        if len(self._sent) >= self.config.max_orders_per_minute:
            self.throttled += 1
            return False
        return True

    def order_sent(self, now_s: float | None = None) -> None:
        self._sent.append(time.monotonic() if now_s is None else now_s)

    def breach(self, equity: float, now_ns: int) -> str | None:
        """Update the day and peak with ``equity`` (currency); the breach reason, or None."""
        day_loss, drawdown = self.observe(equity, now_ns)
        if day_loss >= self.config.max_daily_loss:
            return f"daily loss {day_loss:,.2f} >= max_daily_loss {self.config.max_daily_loss:,.2f}"
        if drawdown >= self.config.max_drawdown:
            return f"drawdown {drawdown:,.2f} >= max_drawdown {self.config.max_drawdown:,.2f}"
        return None

    def observe(self, equity: float, now_ns: int) -> tuple[float, float]:
        """Update the day and peak with ``equity`` (currency); the day's loss and the drawdown
        (what :meth:`breach` judges; a caller already halted only follows them)."""
        day = now_ns // _DAY_NS
        if day != self._day:
            self._day = day
            self._day_start_equity = equity
        self._peak = max(self._peak, equity)
        return self._day_start_equity - equity, self._peak - equity

    def start(self, equity: float, now_ns: int) -> None:
        """Set the day's and the peak's reference at session start (restored equity)."""
        self._day = now_ns // _DAY_NS
        self._day_start_equity = equity
        self._peak = equity


def first_binding(
    config: RiskConfig,
    *,
    order_ns: npt.NDArray[np.int64],
    check_ns: npt.NDArray[np.int64],
    equity: npt.NDArray[np.float64],
) -> tuple[int, str] | None:
    """The first limit that would have acted on a recorded path, as ``(time ns, reason)``, or None.

    ``order_ns``: the time of every order sent (any order); ``check_ns`` and ``equity``: the
    equity (currency, realised + unrealised net of fees, 0 at the start) after each decision,
    in time order. Both run through :class:`RiskLimits` itself, as the daemon runs them: an
    order refused by the rolling order-rate window, then a daily-loss or drawdown breach.
    """
    limits = RiskLimits(config)
    for t in np.sort(np.asarray(order_ns, dtype=np.int64)).tolist():
        if not limits.order_allowed(t / 1e9):
            return t, f"more than max_orders_per_minute {config.max_orders_per_minute} orders in 60 s"
        limits.order_sent(t / 1e9)
    times = np.asarray(check_ns, dtype=np.int64).tolist()
    if times:
        limits.start(0.0, times[0])
    for t, value in zip(times, np.asarray(equity, dtype=np.float64).tolist(), strict=True):
        reason = limits.breach(value, t)
        if reason:
            return t, reason
    return None
