"""The fields of an MBP-10 record that the incremental path (:mod:`feeds.features.incremental`)
reads, unpacked from the record bytes with one :class:`struct.Struct` (each value unpacked is a
Python object made per record, so only these fields are), and their positions in the tuple."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from feeds.records import LEVELS, MBP10_DTYPE

__all__ = [
    "ASKS",
    "ASK_SZS",
    "AT",
    "BIDS",
    "BID_SZS",
    "FIELDS",
    "F_ACTION",
    "F_ASK",
    "F_BID",
    "F_IID",
    "F_LENGTH",
    "F_PRICE",
    "F_RTYPE",
    "F_SEQ",
    "F_SIDE",
    "F_SIZE",
    "F_TS",
    "IID",
    "RECORD",
    "RECORD_SIZE",
]

_FORMATS = {("u", 1): "B", ("u", 4): "I", ("u", 8): "Q", ("i", 8): "q", ("S", 1): "c"}  # of the fields read
_LEVEL_FIELDS = ("bid_px", "ask_px", "bid_sz", "ask_sz")
FIELDS = (
    "length",
    "rtype",
    "instrument_id",
    "price",
    "size",
    "action",
    "side",
    "ts_recv",
    "sequence",
    *(f"{name}_{k:02d}" for k in range(LEVELS) for name in _LEVEL_FIELDS),
)
"""What the incremental path reads of an MBP-10 record, in record order. The fields it does not
use (publisher, ts_event, flags, depth, ts_in_delta, the order counts) are skipped: each value
unpacked is a Python object made per record."""


def _record_struct(names: Sequence[str]) -> struct.Struct:
    """A struct that unpacks the fields ``names`` (in record order) of one MBP-10 record as
    Python values, the other bytes skipped."""
    fmt, at = "<", 0
    for name in names:
        dtype, offset = MBP10_DTYPE.fields[name][:2]  # type: ignore[index]
        if offset < at:
            raise ValueError(f"MBP-10 field {name!r} is not in record order")
        fmt += f"{offset - at}x" if offset > at else ""
        fmt += _FORMATS[dtype.kind, dtype.itemsize]
        at = offset + dtype.itemsize
    return struct.Struct(fmt + (f"{MBP10_DTYPE.itemsize - at}x" if MBP10_DTYPE.itemsize > at else ""))


RECORD = _record_struct(FIELDS)
"""Unpacks the fields that the incremental path reads of one MBP-10 record: a tuple of Python
values, field ``name`` at ``FIELDS.index(name)``."""
AT = {name: i for i, name in enumerate(FIELDS)}
F_LENGTH, F_RTYPE, F_IID, F_PRICE, F_SIZE, F_ACTION, F_SIDE, F_TS, F_SEQ = (
    AT[name]
    for name in ("length", "rtype", "instrument_id", "price", "size", "action", "side", "ts_recv", "sequence")
)
F_BID, F_ASK = AT["bid_px_00"], AT["ask_px_00"]  # top of book
BIDS, ASKS, BID_SZS, ASK_SZS = (
    slice(AT[f"{name}_00"], None, len(_LEVEL_FIELDS)) for name in _LEVEL_FIELDS
)  # the ten levels of each
RECORD_SIZE = MBP10_DTYPE.itemsize
IID = struct.Struct("<4xI")
