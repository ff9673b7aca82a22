"""The NATS subject layout of the market-data bus.

Raw MBP-10 DBN record bytes travel on ``md.mbp10.<dataset>.<symbol>``. NATS subject tokens
cannot contain ``.``, ``*``, ``>`` or whitespace, so names are normalised token by token:
``.`` becomes ``-`` and a space becomes ``_`` (``GLBX.MDP3`` -> ``GLBX-MDP3``, ``ESZ6 C5000`` ->
``ESZ6_C5000``); a name containing ``*``, ``>`` or other whitespace is rejected. The mapping is
for routing only: consumers identify instruments by the ``instrument_id`` inside each record,
never by parsing the subject back.

Examples: ``md.mbp10.GLBX-MDP3.ESZ6`` (one symbol), ``md.mbp10.GLBX-MDP3.>`` (every symbol of a
dataset, the filter of the JetStream stream and of the recorder).

A consumer checks each message's subject again on receipt (:class:`SubjectFilter`): a server
that did not apply the filter (nats-server before 2.10 ignores a consumer's multi-subject
filter) must not feed it another dataset.
"""

from __future__ import annotations

import re
from typing import Literal

from feeds.errors import FeedError

__all__ = [
    "SUBJECT_ROOT",
    "SubjectFilter",
    "dataset_subjects",
    "subject_dataset",
    "subject_for",
    "subject_token",
]

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


class SubjectFilter:
    """The subjects of :func:`dataset_subjects` for ``dataset`` and ``symbols``, as a check on
    received subjects."""

    def __init__(self, dataset: str, symbols: tuple[str, ...] = ()) -> None:
        self.dataset_token = subject_token(dataset)
        self.symbol_tokens = frozenset(subject_token(symbol) for symbol in symbols)

    def mismatch(self, subject: str) -> Literal["dataset", "symbol"] | None:
        """``None`` when ``subject`` is one of the filter's; else what differs: ``"dataset"``
        (another dataset, or not a market-data subject at all) or ``"symbol"``."""
        parts = subject.split(".", 3)
        if len(parts) != 4 or f"{parts[0]}.{parts[1]}" != SUBJECT_ROOT or parts[2] != self.dataset_token:
            return "dataset"
        if self.symbol_tokens and parts[3] not in self.symbol_tokens:
            return "symbol"
        return None


def subject_dataset(subject: str) -> str:
    """The dataset token of a market-data subject (``md.mbp10.SYNTH.ES`` -> ``SYNTH``), or the
    subject itself when it is not one."""
    parts = subject.split(".", 3)
    return parts[2] if len(parts) == 4 and f"{parts[0]}.{parts[1]}" == SUBJECT_ROOT else subject
