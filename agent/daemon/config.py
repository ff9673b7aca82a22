"""Typed settings of the daemon: its loop and the retrain schedule."""

from __future__ import annotations

import datetime as dt
import os
from typing import Literal

import msgspec
from apscheduler.triggers.cron import CronTrigger

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
    write_queue: int = 10_000
    """Ledger writes (venue reports, paper orders' rows) kept in memory while the database
    refuses them (unavailable, disk full); past this many, the pending writes are appended to
    the spill file in ``spill_dir`` instead (never dropped) and read back in order."""
    spill_dir: str = ""
    """Directory of the spill file ``ledger-spill.jsonl``: the writes waiting beyond
    ``write_queue``, and at a stop those not yet persisted, which the next start replays before
    trading. Empty: ``<data_dir>/spill``. Put it on another filesystem than the database so that
    a full disk there leaves room here. An absolute path; one daemon per directory."""
    close_grace_ms: float = 50.0
    """A live feed's time bar whose instrument sends no record past its boundary closes this long
    after the boundary, on the feed clock (records stamped before the boundary that arrive later
    go into the next bar). Longer: fewer such records; shorter: a quiet instrument decided sooner."""
    status_interval_s: float = 1.0
    """Main-loop tick: health checks, watchdog ping, stale-feed checks, metrics refresh."""
    lease_timeout_s: float = 30.0
    """The daemon's lease in the database (one daemon per account and instrument, on any host
    sharing the database) is renewed every third of this; a lease not renewed for this long is
    stale and another daemon may take it over (one of this host whose process is gone, at once)."""

    def __post_init__(self) -> None:
        if self.decision_queue < 1:
            raise ValueError("daemon.decision_queue must be >= 1")
        if self.write_queue < 1:
            raise ValueError("write_queue: must be >= 1")
        if self.spill_dir and not os.path.isabs(self.spill_dir):
            raise ValueError(
                f"spill_dir: {self.spill_dir!r} is not an absolute path (empty: <data_dir>/spill)"
            )
        if self.spill_dir and os.path.exists(self.spill_dir) and not os.path.isdir(self.spill_dir):
            raise ValueError(f"spill_dir: {self.spill_dir} exists and is not a directory")
        if self.stop_timeout_s <= 0 or self.status_interval_s <= 0 or self.db_retry_s <= 0:
            raise ValueError("daemon timeouts and intervals must be > 0")
        if not 0 <= self.close_grace_ms < 60_000:
            raise ValueError(f"close_grace_ms: must be in [0, 60000), got {self.close_grace_ms}")
        if self.lease_timeout_s <= 0:
            raise ValueError("lease_timeout_s: must be > 0")

    @property
    def close_grace_ns(self) -> int:
        """:attr:`close_grace_ms` in ns: the live intake's clock closes, and the backtests'
        count of the bars it concerns (:func:`feeds.bars.clock_closes`)."""
        return round(self.close_grace_ms * 1e6)


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
        self.trigger()
        if self.timeout_s <= 0:
            raise ValueError("schedule.timeout_s must be > 0")

    def trigger(self) -> CronTrigger:
        """The APScheduler trigger of ``cron`` in ``timezone``.

        Checked when the configuration loads: an expression APScheduler refuses, one that never
        fires (``30 2 31 2 *``) or an unknown time zone raises ``ValueError("<field>: ...")``,
        which the loader reports under ``schedule.<field>``.
        """
        try:
            trigger = CronTrigger.from_crontab(self.cron, timezone=self.timezone)
        except LookupError:
            raise ValueError(
                f"timezone: unknown time zone {self.timezone!r} (an IANA name, e.g. 'UTC')"
            ) from None
        except ValueError as exc:
            raise ValueError(
                f"cron: {self.cron!r} is not a crontab expression (minute hour day month day-of-week): {exc}"
            ) from None
        if trigger.get_next_fire_time(None, dt.datetime.now(trigger.timezone)) is None:
            raise ValueError(f"cron: {self.cron!r} never fires")
        return trigger
