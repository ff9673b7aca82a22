"""Typed settings of execution: the paper broker and the live gateway link."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["BrokerConfig", "FillPrice"]

FillPrice = Literal["book", "mid"]
"""How an execution is priced: the levels taken (``book``) or the mid (``mid``, a control
experiment): :attr:`BrokerConfig.fill_price`."""


class BrokerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where orders go and how the paper broker simulates the exchange (DESIGN section 8)."""

    mode: Literal["paper", "gateway"] = "paper"
    """``paper``: the in-process paper broker fills against the live book. ``gateway``: orders go
    over ZeroMQ to an execution gateway (``tradeagent gateway`` is the reference one)."""
    latency_ms: float = 2.0
    """Paper broker: an order placed at t reaches the book at t + latency (feed clock)."""
    fee_per_contract: float = 1.0
    """Paper broker: fee charged per contract filled, in account currency."""
    order_type: Literal["market", "limit"] = "market"
    """Orders the daemon sends: marketable orders that walk the book, or limit orders at the
    near touch that rest with a queue-position estimate."""
    fill_price: FillPrice = "book"
    """Paper broker: the price of an execution. ``book``: the volume-weighted price of the levels
    the order takes (what a venue charges: half the spread and more from the mid). ``mid``: a
    control experiment, not a venue: the order fills at the mid of the book it meets (same book,
    same quantities limited by the displayed depth, fees as configured), so trading costs no
    spread. With ``fee_per_contract = 0`` it removes every trading cost, which shows whether a
    policy is rejected by the statistics or by cost drag. The training environment and the
    vectorised backtest fill the same way (:func:`agent.execution.fills.execution_price`); the
    sizing's cost gate must charge the same (``policy.leg_price``, checked at load). Market
    orders only."""
    gateway_endpoint: str = "tcp://127.0.0.1:5571"
    """ZeroMQ endpoint of the execution gateway (the daemon connects, the gateway binds)."""
    account: str = "paper"
    """Account name sent to the gateway in ``Hello``; the gateway keeps one journal per account."""
    ack_timeout_s: float = 2.0
    """An order without an acknowledgement after this long halts new orders (the gateway is
    considered unreachable); the order stays open until the gateway answers."""

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise ValueError("broker.latency_ms must be >= 0")
        if self.fee_per_contract < 0:
            raise ValueError("broker.fee_per_contract must be >= 0")
        if self.ack_timeout_s <= 0:
            raise ValueError("broker.ack_timeout_s must be > 0")
        if self.fill_price == "mid" and self.order_type == "limit":
            raise ValueError(
                "fill_price: 'mid' prices market orders only (a resting limit order fills at its "
                'limit): set order_type = "market"'
            )
