"""Wire messages between the daemon and an execution gateway (ZeroMQ, msgpack via msgspec).

Transport: the gateway binds a ROUTER socket, each daemon connects a DEALER socket. Every frame
is one msgpack-encoded message; the ``type`` field tags it. The daemon sends :class:`Hello`
first, then :class:`NewOrder` and :class:`CancelOrder`; the gateway answers with :class:`Ack`,
:class:`Reject`, :class:`Fill`, :class:`Cancelled` and periodic :class:`Heartbeat`.

Units: quantities are contracts (positive integers; the direction is ``side``); prices are
Databento 1e-9 fixed-point integers; fees are account currency; timestamps are UNIX epoch
nanoseconds.

Reliability: every gateway -> daemon report carries ``seq``, strictly increasing per account.
The gateway keeps a journal of its reports; a daemon that (re)connects sends
``Hello(account, last_seq)`` and the gateway replays every report with a larger ``seq``, so a
reconnect loses nothing. Fills carry a globally unique ``fill_id``; the daemon stores fills
idempotently by that id, so a replayed fill is never counted twice. The daemon never assumes a
fill that it has not received: until a :class:`Fill` arrives, an order is only open.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "Ack",
    "CancelOrder",
    "Cancelled",
    "ClientMessage",
    "Fill",
    "GatewayMessage",
    "Heartbeat",
    "Hello",
    "NewOrder",
    "OrderType",
    "ProtocolError",
    "Reject",
    "Report",
    "Side",
    "decode_client",
    "decode_gateway",
    "encode",
]

Side = Literal["buy", "sell"]
OrderType = Literal["market", "limit"]


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol."""


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True):
    pass


class Hello(_Msg, tag="hello", frozen=True, kw_only=True):
    """Daemon -> gateway, first message after connecting: replay reports after ``last_seq``."""

    account: str
    last_seq: int = 0


class NewOrder(_Msg, tag="new", frozen=True, kw_only=True):
    """Daemon -> gateway: a new order. ``client_order_id`` is unique for the account forever."""

    client_order_id: str
    instrument_id: int
    side: Side
    qty: int
    order_type: OrderType = "market"
    limit_price: int | None = None
    """Required for limit orders (1e-9 fixed point); market orders walk the book."""
    ts_ns: int


class CancelOrder(_Msg, tag="cancel", frozen=True, kw_only=True):
    """Daemon -> gateway: cancel what is left of an open order."""

    client_order_id: str
    ts_ns: int


class Ack(_Msg, tag="ack", frozen=True, kw_only=True):
    """Gateway -> daemon: the order was accepted (it is now working)."""

    seq: int
    client_order_id: str
    ts_ns: int


class Reject(_Msg, tag="reject", frozen=True, kw_only=True):
    """Gateway -> daemon: the order (or cancel) was refused; nothing was filled by it."""

    seq: int
    client_order_id: str
    reason: str
    ts_ns: int


class Fill(_Msg, tag="fill", frozen=True, kw_only=True):
    """Gateway -> daemon: an execution. ``leaves_qty`` is what remains open after it."""

    seq: int
    fill_id: str
    client_order_id: str
    instrument_id: int
    side: Side
    qty: int
    price: int
    fee: float
    leaves_qty: int
    ts_ns: int


class Cancelled(_Msg, tag="cancelled", frozen=True, kw_only=True):
    """Gateway -> daemon: the rest of an order is no longer working (cancel request, or an
    immediate-or-cancel remainder when the book ran out of depth)."""

    seq: int
    client_order_id: str
    cancelled_qty: int
    reason: str
    ts_ns: int


class Heartbeat(_Msg, tag="heartbeat", frozen=True, kw_only=True):
    """Gateway -> daemon, about once a second: the link is alive; ``seq`` is the last report's."""

    seq: int
    ts_ns: int


ClientMessage = Hello | NewOrder | CancelOrder
Report = Ack | Reject | Fill | Cancelled
GatewayMessage = Ack | Reject | Fill | Cancelled | Heartbeat

_encoder = msgspec.msgpack.Encoder()
_client_decoder = msgspec.msgpack.Decoder(ClientMessage)
_gateway_decoder = msgspec.msgpack.Decoder(GatewayMessage)


def encode(message: ClientMessage | GatewayMessage) -> bytes:
    """Serialise one message to its msgpack frame."""
    return _encoder.encode(message)


def decode_client(frame: bytes) -> ClientMessage:
    """Parse a daemon -> gateway frame; :class:`ProtocolError` if it is not one."""
    try:
        message: ClientMessage = _client_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"invalid client message: {exc}") from None
    _validate(message)
    return message


def decode_gateway(frame: bytes) -> GatewayMessage:
    """Parse a gateway -> daemon frame; :class:`ProtocolError` if it is not one."""
    try:
        message: GatewayMessage = _gateway_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"invalid gateway message: {exc}") from None
    return message


def _validate(message: ClientMessage) -> None:
    if isinstance(message, NewOrder):
        if message.qty <= 0:
            raise ProtocolError(f"order {message.client_order_id}: qty must be > 0")
        if message.order_type == "limit" and message.limit_price is None:
            raise ProtocolError(f"order {message.client_order_id}: limit order without limit_price")
