"""Typed settings of the daemon: its loop, hard risk limits and the retrain schedule."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["DaemonConfig", "RiskConfig", "ScheduleConfig"]


class DaemonConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The asyncio daemon (``tradeagent run``)."""

    mode: Literal["paper", "live"] = "paper"
    """``live`` requires ``broker.mode = "gateway"`` (checked at start)."""
    decision_queue: int = 64
    """Bound of the queue between bar closes and the decision task; when full, the oldest
    pending decision is dropped and counted (decisions go stale, fills never queue here)."""
    stale_decision_ms: float = 500.0
    """A bar close older than this (wall clock) when its decision would be taken is dropped."""
    stop_timeout_s: float = 20.0
    """SIGTERM: stop intake, cancel resting orders, persist and exit within this time."""
    cpu_fallback: bool = False
    """After an inference failure on the GPU, rebuild the engine on the CPU (logged) instead of
    halting new orders. Off by default: a failure halts new orders and keeps all state."""
    checkpoint: str = ""
    """sha256 of the checkpoint to trade; empty: the promoted one for the instrument set."""
    db_retry_s: float = 1.0
    """While the database is unavailable, retry pending ledger writes this often."""
    status_interval_s: float = 1.0
    """Main-loop tick: health checks, watchdog ping, stale-feed checks, metrics refresh."""

    def __post_init__(self) -> None:
        if self.decision_queue < 1:
            raise ValueError("daemon.decision_queue must be >= 1")
        if self.stop_timeout_s <= 0 or self.status_interval_s <= 0 or self.db_retry_s <= 0:
            raise ValueError("daemon timeouts and intervals must be > 0")


class RiskConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Hard limits checked before every order (DESIGN section 7). A loss or drawdown breach
    flattens every position and halts trading; the halt is persisted and survives restarts
    until an operator sends ``tradeagent ctl resume``."""

    max_position: int = 5
    """Largest absolute position per instrument, in contracts."""
    max_orders_per_minute: int = 120
    """Orders sent across all instruments in any rolling 60 s window."""
    max_daily_loss: float = 5_000.0
    """Largest loss of the UTC trading day (realised + unrealised), in account currency."""
    max_drawdown: float = 10_000.0
    """Largest fall of equity from its peak within the session, in account currency."""

    def __post_init__(self) -> None:
        if self.max_position < 0 or self.max_orders_per_minute < 1:
            raise ValueError("risk.max_position must be >= 0 and risk.max_orders_per_minute >= 1")
        if self.max_daily_loss <= 0 or self.max_drawdown <= 0:
            raise ValueError("risk.max_daily_loss and risk.max_drawdown must be > 0")


class ScheduleConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The nightly retrain: a cron job that starts ``tradeagent train --promote`` as a subprocess."""

    enabled: bool = True
    cron: str = "30 2 * * *"
    """Standard five-field crontab expression (minute hour day month day-of-week)."""
    timezone: str = "UTC"
    timeout_s: float = 4 * 3600.0
    """A retrain still running after this long is killed (and logged); trading is unaffected."""
    command: tuple[str, ...] = ()
    """The retrain command; empty: ``<python> -m agent.cli [--config FILE] train --promote``."""

    def __post_init__(self) -> None:
        if len(self.cron.split()) != 5:
            raise ValueError("schedule.cron must have five fields: minute hour day month day-of-week")
        if self.timeout_s <= 0:
            raise ValueError("schedule.timeout_s must be > 0")
