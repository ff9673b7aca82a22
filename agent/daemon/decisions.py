"""The decision task: bar closes from the decision queue through the trading step to orders.

The task takes every queued bar close at once and decides them in rounds: round r holds the r-th
pending bar of every instrument, and each round is one batched ``decide`` of
:class:`agent.trading.step.TradingStep` over the serving engine (regime scale with the learned
floor x Kelly -> target). Then, per instrument, only its last bar may send an order
(:meth:`TradingStep.order_for`: risk clamp, order rate, the book's health now, the difference to
position plus working orders), through :meth:`agent.daemon.placement.Placement.place`. After each
round the risk guard checks the loss limits on the feed clock
(:meth:`agent.daemon.supervision.RiskGuard.after_round`).

* **Stale decisions are dropped and counted**: a bar whose closing record arrived more than
  ``daemon.stale_decision_ms`` ago is still pushed through the model (windows stay complete) but
  sends no order (``stale_decisions``).
* **No order** while any halt is active, the intake stops or a flatten runs, nor on an unhealthy
  instrument (the engine marks its row not valid).
* While no model serves, the bars still move the regime trackers (``bars_without_model``).
* **An inference failure** (:class:`agent.gpu.errors.InferenceError`) is fail-safe: counted
  (``inference_failures``), and an ``inference`` halt keeps every position and order; only with
  ``daemon.cpu_fallback`` is the engine rebuilt on the CPU instead (logged).

Every decision is counted (by instrument and action); each bar that may trade is published on
the telemetry socket (topic ``decision``, with ``latency_ns`` from the arrival of its closing
record to the decision taken); the health of each instrument's last bar is kept for the status.
A round's orders leave before its counts and telemetry: nothing they send waits for them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from agent.daemon.config import DaemonConfig
from agent.daemon.events import Events
from agent.daemon.intake import Close, DecisionQueue, Intake
from agent.daemon.lifecycle import Component, State
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.model_host import ModelHost
from agent.daemon.placement import Placement
from agent.daemon.supervision import RiskGuard
from agent.errors import AgentError
from agent.execution.protocol import NewOrder
from agent.gpu.errors import InferenceError
from agent.policy.kelly import regime_clamp
from agent.trading.decider import EngineDecider
from agent.trading.step import BarClose, TradingStep, decision_rounds

__all__ = ["Decisions"]

log = logging.getLogger(__name__)

_ACTIONS = ("short", "flat", "long")

_Bar = tuple[Close, BarClose, bool]
"""One bar of a round (:func:`agent.trading.step.decision_rounds`): the close it came from, the
bar, whether it is its instrument's last pending bar."""


class Decisions(Component):
    """The decision task (see the module docstring)."""

    def __init__(
        self,
        *,
        queue: DecisionQueue,
        intake: Intake,
        trading: TradingStep,
        models: ModelHost,
        placement: Placement,
        guard: RiskGuard,
        metrics: DaemonMetrics,
        events: Events,
        config: DaemonConfig,
        scale_floor: float,
        symbols: Mapping[int, str],
    ) -> None:
        super().__init__("decisions")
        self._queue = queue
        self._intake = intake
        self._trading = trading
        self._models = models
        self._placement = placement
        self._guard = guard
        self._metrics = metrics
        self._events = events
        self._stale_ns = int(config.stale_decision_ms * 1e6)
        self._cpu_fallback = config.cpu_fallback
        self._scale_floor = scale_floor
        self._symbols = symbols
        self.healthy: dict[int, bool] = dict.fromkeys(symbols, False)
        """Per instrument: its last bar was tradable."""

    async def _start(self) -> None:
        self._task(self._run(), "decisions")

    async def _stop(self) -> None:
        await self._cancel_tasks()

    async def _run(self) -> None:
        while True:
            closes = await self._queue.take()
            if closes:
                await self._decide(closes)
            self._queue.taken()

    async def _decide(self, closes: list[Close]) -> None:
        """One ``decide`` per round (:func:`agent.trading.step.decision_rounds`): round r holds
        the r-th pending bar of every instrument."""
        for batch in decision_rounds(closes, lambda close: close.frame):
            await self._round(batch)
            self._guard.after_round(max(self._intake.order_ns(close) for close, _, _ in batch))

    async def _round(self, batch: list[_Bar]) -> None:
        trading = self._trading
        closes = [bar for _, bar, _ in batch]
        for c in closes:
            tradable = bool(c.frame.tradable[c.row])
            self.healthy[c.instrument_id] = tradable
            self._metrics.set_healthy(self._symbols[c.instrument_id], tradable)
        engine = self._models.engine
        if engine is None:
            trading.track(closes)
            self._metrics.count("bars_without_model", len(batch))
            return
        try:
            step = trading.decide(closes, EngineDecider(engine))
        except InferenceError as exc:
            await self._inference_failed(exc)
            return
        decided = step.decided
        now = time.time_ns()
        stopping = self._intake.state is not State.RUNNING
        blocked = bool(self._events.halts) or stopping or self._guard.flattening
        orders: list[NewOrder] = []
        arrivals: list[int] = []
        traded: list[int] = []  # the rows that may trade (their telemetry follows the orders)
        for j, (close, _, last) in enumerate(batch):
            if not last or not decided.valid[j]:
                continue
            if now - close.arrival_ns > self._stale_ns:
                self._metrics.dropped("stale_decision")
                continue
            traded.append(j)
            order = trading.order_for(
                closes[j],
                int(decided.target[j]),
                now_ns=self._intake.order_ns(close),
                blocked=blocked,
                wall_ns=now,
            )
            if order is not None:
                orders.append(order)
                arrivals.append(close.arrival_ns)
        if orders:  # the orders leave first; the round's counts and telemetry come after them
            self._placement.place(orders, arrivals)
        for j, c in enumerate(closes):
            self._metrics.decision(self._symbols[c.instrument_id], _ACTIONS[int(decided.action[j])])
        regime = regime_clamp(step.regime, self._scale_floor)
        for j in traded:
            close, c, _ = batch[j]
            self._events.publish(
                "decision",
                {
                    "instrument": self._symbols[c.instrument_id],
                    "ts_close": int(c.frame.ts_close[c.row]),
                    "action": int(decided.action[j]),
                    "target": int(decided.target[j]),
                    "size": float(decided.size[j]),
                    "regime": float(regime[j]),
                    "model": engine.model_sha256,
                    "latency_ns": now - close.arrival_ns,
                },
            )

    async def _inference_failed(self, exc: InferenceError) -> None:
        self._metrics.count("inference_failures")
        if self._cpu_fallback:
            log.error("inference failed (%s); daemon.cpu_fallback = true: rebuilding on the CPU", exc)
            try:
                await asyncio.to_thread(self._models.fall_back_to_cpu)
            except AgentError as again:
                self._events.halt("inference", f"CPU fallback failed: {again}")
                return
            self._events.emit("fallback", f"inference failed ({exc}); now on the CPU")
            return
        self._events.halt("inference", str(exc))
        self._events.emit("halt", f"inference failure: {exc}", details={"kind": "inference"})
