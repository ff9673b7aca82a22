"""Control-socket messages (JSON via msgspec): one request, one reply."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "COMMANDS",
    "Command",
    "ControlReply",
    "ControlRequest",
    "decode_reply",
    "decode_request",
    "encode",
]

Command = Literal["status", "halt", "resume", "flatten", "reload", "promote", "rollback"]
COMMANDS: tuple[str, ...] = ("status", "halt", "resume", "flatten", "reload", "promote", "rollback")


class ControlRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``command`` with string arguments (``halt``: reason; ``promote``: sha256)."""

    command: Command
    args: dict[str, str] = {}
    origin: str = ""
    """Who asks, as the client declares it (``user@host pid N``); over tcp the server appends
    the CURVE key the client authenticated with. The daemon logs it with operator commands."""


class ControlReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ok: bool
    result: dict[str, Any] = {}
    error: str = ""


_request_decoder = msgspec.json.Decoder(ControlRequest)
_reply_decoder = msgspec.json.Decoder(ControlReply)
_encoder = msgspec.json.Encoder()


def encode(message: ControlRequest | ControlReply) -> bytes:
    return _encoder.encode(message)


def decode_request(frame: bytes) -> ControlRequest:
    """Raises ``msgspec.DecodeError`` (a ValueError) on a malformed request."""
    return _request_decoder.decode(frame)


def decode_reply(frame: bytes) -> ControlReply:
    return _reply_decoder.decode(frame)
