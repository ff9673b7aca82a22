"""Typed settings of the daemon: its loop and the retrain schedule."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["DaemonConfig", "ScheduleConfig"]


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
