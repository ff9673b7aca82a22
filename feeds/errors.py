"""Errors of the market-data layer.

FeedError
 +-- DBNFormatError      bytes or files that are not valid DBN, or not the schema we need
 +-- UnknownInstrument   a symbol or instrument id that the configuration does not know
"""

from __future__ import annotations

__all__ = ["DBNFormatError", "FeedError", "UnknownInstrument"]


class FeedError(Exception):
    """Base of errors raised by ``feeds``."""


class DBNFormatError(FeedError):
    """Input is not valid DBN, is truncated, or has a schema other than the one required."""


class UnknownInstrument(FeedError):
    """A symbol or instrument id that is not configured."""
