"""The daemon's one counting system: each count ``tradeagent ctl status`` shows, kept once, and
the Prometheus series on localhost (``control.metrics_host:metrics_port``) fed by the same call.

The parts of the daemon never touch a Prometheus object or a counter of their own: they say what
happened (:meth:`DaemonMetrics.decision`, :meth:`~DaemonMetrics.order_sent`,
:meth:`~DaemonMetrics.fill`, :meth:`~DaemonMetrics.dropped`, :meth:`~DaemonMetrics.feed_event`,
:meth:`~DaemonMetrics.count`) and this class adds it to the status count and, where Prometheus
has a series for it, to that series:

* ``decisions``: ``tradeagent_decisions_total{instrument,action}``;
* ``orders``: ``tradeagent_orders_total{instrument,side}``, and the order's latency in the
  ``tradeagent_decision_latency_seconds`` histogram;
* ``fills``: ``tradeagent_fills_total{instrument}`` and ``tradeagent_filled_contracts_total``;
* ``dropped_decisions`` and ``stale_decisions``: ``tradeagent_drops_total{kind}`` (``kind``
  ``decision_queue`` and ``stale_decision``);
* ``rejected_messages``: ``tradeagent_rejections_total{kind="feed_bytes"}``;
* ``feed_<kind>`` (a feed health event of that kind): ``tradeagent_feed_gaps_total{kind}``;
* every other count (:meth:`~DaemonMetrics.count`: ``inference_failures``, ``duplicate_fills``,
  ``feed_runs``, ``retrain_<outcome>``, ...): the status only.

Counts another object keeps (the trading step's ``orders_blocked_by_book`` and
``throttled_orders``) are read from it when the counts are (:meth:`DaemonMetrics.include`). The
gauges (P&L, positions, health, halted, the model served) are set from the state they show.

Each :class:`DaemonMetrics` owns its own registry, so several daemons (or tests) in one process
never collide. Names follow Prometheus conventions (``_total`` counters, seconds, base units).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from agent.errors import AgentError
from feeds.sources import HealthEvent, HealthKind

__all__ = ["DaemonMetrics"]

log = logging.getLogger(__name__)

# Bar-close-to-decision latency buckets, seconds: 50 us .. 1 s.
_LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)

_DROPS = {"decision_queue": "dropped_decisions", "stale_decision": "stale_decisions"}


class DaemonMetrics:
    """Every count and gauge of one daemon. ``serve()`` starts the HTTP endpoint (a daemon thread)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._counts: collections.Counter[str] = collections.Counter()
        self._included: list[Callable[[], Mapping[str, int]]] = []
        self._latency = Histogram(
            "tradeagent_decision_latency_seconds",
            "From the arrival of the record closing a bar to the decision (and order) leaving.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._decisions = Counter(
            "tradeagent_decisions_total", "Decisions taken", ["instrument", "action"], registry=r
        )
        self._orders = Counter("tradeagent_orders_total", "Orders sent", ["instrument", "side"], registry=r)
        self._fills = Counter("tradeagent_fills_total", "Fills recorded", ["instrument"], registry=r)
        self._filled = Counter(
            "tradeagent_filled_contracts_total", "Contracts filled", ["instrument"], registry=r
        )
        self._pnl = Gauge("tradeagent_pnl", "Session P&L in account currency", ["kind"], registry=r)
        self._position = Gauge("tradeagent_position_contracts", "Signed position", ["instrument"], registry=r)
        self._drops = Counter("tradeagent_drops_total", "Counted drops", ["kind"], registry=r)
        self._gaps = Counter("tradeagent_feed_gaps_total", "Feed gaps and reconnects", ["kind"], registry=r)
        self._rejections = Counter(
            "tradeagent_rejections_total", "Rejected inputs and orders", ["kind"], registry=r
        )
        self._healthy = Gauge(
            "tradeagent_instrument_healthy", "1 when the instrument may trade", ["instrument"], registry=r
        )
        self._halted = Gauge("tradeagent_halted", "1 while new orders are halted", registry=r)
        self._model = Gauge(
            "tradeagent_model_info", "1 for the checkpoint in use (label sha256)", ["sha256"], registry=r
        )
        self._model_sha = ""
        self._server: Any = None

    # -- counts ----------------------------------------------------------------------------------

    def counts(self) -> collections.Counter[str]:
        """Every count now (a copy: a missing key reads 0), with those of :meth:`include`."""
        out = collections.Counter(self._counts)
        for counts in self._included:
            out.update(counts())
        return out

    def include(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Report the counts another object keeps (read each time the counts are)."""
        self._included.append(counts)

    def count(self, key: str, n: int = 1) -> None:
        """A count only ``ctl status`` shows (``inference_failures``, ``duplicate_fills``, ...)."""
        self._counts[key] += n

    def decision(self, instrument: str, action: str) -> None:
        self._counts["decisions"] += 1
        self._decisions.labels(instrument=instrument, action=action).inc()

    def order_sent(self, instrument: str, side: str, latency_s: float) -> None:
        """An order left; ``latency_s`` from the arrival of the record that closed its bar."""
        self._counts["orders"] += 1
        self._orders.labels(instrument=instrument, side=side).inc()
        self._latency.observe(latency_s)

    def fill(self, instrument: str, qty: int, position: int) -> None:
        """A fill the ledger committed; ``position`` is the instrument's position after it."""
        self._counts["fills"] += 1
        self._fills.labels(instrument=instrument).inc()
        self._filled.labels(instrument=instrument).inc(qty)
        self._position.labels(instrument=instrument).set(position)

    def dropped(self, kind: Literal["decision_queue", "stale_decision"]) -> None:
        """A bar close dropped from a full decision queue, or decided too late to send an order."""
        self._counts[_DROPS[kind]] += 1
        self._drops.labels(kind=kind).inc()

    def feed_event(self, event: HealthEvent) -> None:
        """A health event of the source: rejected messages by their number, others once each."""
        if event.kind is HealthKind.REJECTED:
            self._counts["rejected_messages"] += event.count or 1
            self._rejections.labels(kind="feed_bytes").inc(event.count or 1)
        else:
            self._counts[f"feed_{event.kind.value}"] += 1
            self._gaps.labels(kind=event.kind.value).inc()

    # -- gauges ----------------------------------------------------------------------------------

    def set_pnl(self, realised: float, unrealised: float) -> None:
        self._pnl.labels(kind="realised").set(realised)
        self._pnl.labels(kind="unrealised").set(unrealised)

    def set_position(self, instrument: str, qty: int) -> None:
        self._position.labels(instrument=instrument).set(qty)

    def set_healthy(self, instrument: str, healthy: bool) -> None:
        self._healthy.labels(instrument=instrument).set(1 if healthy else 0)

    def set_halted(self, halted: bool) -> None:
        self._halted.set(1 if halted else 0)

    def set_model(self, sha256: str) -> None:
        if self._model_sha:
            self._model.remove(self._model_sha)
        self._model_sha = sha256
        self._model.labels(sha256=sha256).set(1)

    # -- endpoint --------------------------------------------------------------------------------

    @property
    def port(self) -> int | None:
        """The port the endpoint listens on (``serve(host, 0)`` picks one), None when not served."""
        return int(self._server.server_address[1]) if self._server is not None else None

    def serve(self, host: str, port: int) -> None:
        """Start the HTTP endpoint; a port in use is an :class:`AgentError` naming it."""
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise AgentError(f"metrics endpoint {host}:{port} cannot be opened: {exc}") from None
        log.info("prometheus metrics on http://%s:%d/metrics", host, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
