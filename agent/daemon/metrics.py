"""Prometheus metrics of the daemon, served on localhost (``control.metrics_host:metrics_port``).

Each :class:`DaemonMetrics` owns its own registry, so several daemons (or tests) in one process
never collide. Names follow Prometheus conventions (``_total`` counters, seconds, base units).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from agent.errors import AgentError

__all__ = ["DaemonMetrics"]

log = logging.getLogger(__name__)

# Bar-close-to-decision latency buckets, seconds: 50 us .. 1 s.
_LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)


class DaemonMetrics:
    """All metrics of one daemon. ``serve()`` starts the HTTP endpoint (a daemon thread)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decision_latency = Histogram(
            "tradeagent_decision_latency_seconds",
            "From the arrival of the record closing a bar to the decision (and order) leaving.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "tradeagent_decisions_total", "Decisions taken", ["instrument", "action"], registry=r
        )
        self.orders = Counter("tradeagent_orders_total", "Orders sent", ["instrument", "side"], registry=r)
        self.fills = Counter("tradeagent_fills_total", "Fills recorded", ["instrument"], registry=r)
        self.filled_contracts = Counter(
            "tradeagent_filled_contracts_total", "Contracts filled", ["instrument"], registry=r
        )
        self.pnl = Gauge("tradeagent_pnl", "Session P&L in account currency", ["kind"], registry=r)
        self.position = Gauge("tradeagent_position_contracts", "Signed position", ["instrument"], registry=r)
        self.drops = Counter("tradeagent_drops_total", "Counted drops", ["kind"], registry=r)
        self.gaps = Counter("tradeagent_feed_gaps_total", "Feed gaps and reconnects", ["kind"], registry=r)
        self.rejections = Counter(
            "tradeagent_rejections_total", "Rejected inputs and orders", ["kind"], registry=r
        )
        self.healthy = Gauge(
            "tradeagent_instrument_healthy", "1 when the instrument may trade", ["instrument"], registry=r
        )
        self.halted = Gauge("tradeagent_halted", "1 while new orders are halted", registry=r)
        self.model = Gauge(
            "tradeagent_model_info", "1 for the checkpoint in use (label sha256)", ["sha256"], registry=r
        )
        self._model_sha = ""
        self._server: Any = None

    def set_model(self, sha256: str) -> None:
        if self._model_sha:
            self.model.remove(self._model_sha)
        self._model_sha = sha256
        self.model.labels(sha256=sha256).set(1)

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
