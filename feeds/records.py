"""The in-memory form of MBP-10 records shared by every part of ``feeds``.

Records travel as NumPy structured arrays with Databento's own MBP-10 layout
(:data:`MBP10_DTYPE`, 368 bytes per record, header included), exactly as DBN stores them,
so decoding is a view and never a per-record Python loop. Prices stay 1e-9 fixed-point integers
until features are computed.
"""

from __future__ import annotations

import databento_dbn
import numpy as np

__all__ = [
    "ACTION_ADD",
    "ACTION_CANCEL",
    "ACTION_CLEAR",
    "ACTION_FILL",
    "ACTION_MODIFY",
    "ACTION_NONE",
    "ACTION_TRADE",
    "LEVELS",
    "MBP10_CODES",
    "MBP10_DTYPE",
    "MBP10_RTYPE",
    "PRICE_SCALE",
    "SIDE_ASK",
    "SIDE_BID",
    "SIDE_NONE",
    "UNDEF_PRICE",
]

MBP10_DTYPE: np.dtype[np.void] = np.dtype(databento_dbn.MBP10Msg._dtypes)
MBP10_RTYPE = 0x0A
LEVELS = 10
PRICE_SCALE = 1_000_000_000
"""Fixed-point steps per price unit: DBN stores a price ``p`` as the integer ``round(p * PRICE_SCALE)``."""
UNDEF_PRICE = np.iinfo(np.int64).max

# `action` and `side` are single ASCII bytes (dtype S1): compare with these `bytes` values.
ACTION_ADD = b"A"
ACTION_CANCEL = b"C"
ACTION_MODIFY = b"M"
ACTION_TRADE = b"T"
ACTION_FILL = b"F"
ACTION_CLEAR = b"R"
ACTION_NONE = b"N"
SIDE_BID = b"B"
SIDE_ASK = b"A"
SIDE_NONE = b"N"

_CODE_OFFSETS: list[int] = [MBP10_DTYPE.fields[name][1] for name in ("action", "side")]  # type: ignore[index]
MBP10_CODES: np.dtype[np.void] = np.dtype(
    {
        "names": ["action", "side"],
        "formats": ["u1", "u1"],
        "offsets": _CODE_OFFSETS,
        "itemsize": MBP10_DTYPE.itemsize,
    }
)
"""``records.view(MBP10_CODES)``: the ``action`` and ``side`` bytes of MBP-10 records as uint8
codes (compare with ``ord(ACTION_TRADE)``...), a view of any 1-D record array: NumPy compares
``S1`` fields as strings, several times slower."""
