"""What the daemon reports about itself: the typed snapshot behind ``tradeagent ctl status``.

:meth:`agent.daemon.app.Daemon.status` builds a :class:`DaemonStatus` from its parts; the
control socket answers ``status`` with :meth:`DaemonStatus.to_dict` (the same keys, in this
order, as JSON), and tests, the benchmark and tools in the daemon's process read the fields.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agent.daemon.lifecycle import State

__all__ = ["DaemonStatus", "Recovered"]


class Recovered(msgspec.Struct, frozen=True, kw_only=True):
    """What the ledger gave back at start."""

    positions: dict[str, int]
    """Signed position per symbol."""
    realised_pnl: float
    open_orders: int
    """Orders restored as working (gateway mode: the gateway's replay reconciles them)."""
    closed_paper_orders: int
    """Orders of a previous process closed as cancelled (paper mode: its exchange is gone)."""


class DaemonStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One daemon's state at one moment (``tradeagent ctl status``)."""

    state: State
    mode: str
    """``daemon.mode``: paper or live."""
    broker: str
    """``broker.mode``: paper or gateway."""
    session_id: int
    """The daemon session in the database (0 before it started)."""
    halts: dict[str, str]
    """Active halts of new orders, kind -> reason."""
    flattening: bool
    """A flatten (``ctl flatten`` or a risk breach) is closing the positions."""
    model: str
    """sha256 of the checkpoint served; empty while none is."""
    positions: dict[str, int]
    open_orders: int
    open_order_ids: list[str]
    realised_pnl: float
    unrealised_pnl: float
    healthy: dict[str, bool]
    """Per symbol: its last bar was tradable."""
    counts: dict[str, int]
    """The counts of :class:`agent.daemon.metrics.DaemonMetrics`."""
    feed: dict[str, int]
    """The source's counters (records, messages, rejected, dropped, gaps, ...)."""
    rejected_records: int
    """Records the book's health rules refused."""
    retrain_running: bool
    recovered: Recovered | None
    """What the ledger gave back at start (None before the recovery)."""
    ledger_backlog: dict[str, Any]
    """The ledger writes waiting (:meth:`agent.daemon.backlog.Backlog.describe`)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form the control socket sends."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out
