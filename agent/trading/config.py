"""Typed settings of the trading step's hard risk limits (composed into
:class:`agent.config.Config` as ``risk``; defaults in ``config/defaults.toml``)."""

from __future__ import annotations

import msgspec

__all__ = ["RiskConfig"]


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
