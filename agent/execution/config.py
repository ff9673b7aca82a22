"""Typed settings of execution: the paper broker and the live gateway link."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["BrokerConfig"]


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
