"""The NATS subject layout of the market-data bus.

Raw MBP-10 DBN record bytes travel on ``md.mbp10.<dataset>.<symbol>``. NATS subject tokens
cannot contain ``.``, ``*``, ``>`` or whitespace, so names are normalised token by token:
``.`` becomes ``-`` and a space becomes ``_`` (``GLBX.MDP3`` -> ``GLBX-MDP3``, ``ESZ6 C5000`` ->
``ESZ6_C5000``); a name containing ``*``, ``>`` or other whitespace is rejected. The mapping is
for routing only: consumers identify instruments by the ``instrument_id`` inside each record,
never by parsing the subject back.

Examples: ``md.mbp10.GLBX-MDP3.ESZ6`` (one symbol), ``md.mbp10.GLBX-MDP3.>`` (every symbol of a
dataset, the filter of the JetStream stream and of the recorder).
"""

from __future__ import annotations

import re

from feeds.errors import FeedError

__all__ = ["SUBJECT_ROOT", "dataset_subjects", "subject_for", "subject_token"]

SUBJECT_ROOT = "md.mbp10"
_BAD = re.compile(r"[*>\s]")


def subject_token(name: str) -> str:
    """Normalise a dataset or symbol name into one NATS subject token."""
    token = name.replace(".", "-").replace(" ", "_")
    if not token or _BAD.search(token):
        raise FeedError(f"{name!r} cannot be used in a NATS subject (empty, wildcard or whitespace)")
    return token


def subject_for(dataset: str, symbol: str) -> str:
    """``md.mbp10.<dataset>.<symbol>`` with both names normalised."""
    return f"{SUBJECT_ROOT}.{subject_token(dataset)}.{subject_token(symbol)}"


def dataset_subjects(dataset: str, symbols: tuple[str, ...] = ()) -> list[str]:
    """The subjects to subscribe to: one per symbol, or the dataset wildcard when none are given."""
    if not symbols:
        return [f"{SUBJECT_ROOT}.{subject_token(dataset)}.>"]
    return [subject_for(dataset, symbol) for symbol in symbols]
