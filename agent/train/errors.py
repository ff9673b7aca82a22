"""Errors of the trainer.

::

    AgentError
    └── TrainError           training cannot run on this data or configuration: fix the input
        ├── TrainTimeout     the --max-minutes limit ended the run; nothing was registered
        └── IncumbentUnusable the promoted checkpoint cannot be loaded: found before training
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["IncumbentUnusable", "TrainError", "TrainTimeout"]


class TrainError(AgentError):
    """Training cannot run on this data or configuration; the message says why."""


class TrainTimeout(TrainError):
    """The time limit ended training cleanly: no candidate was registered, nothing half-written."""


class IncumbentUnusable(TrainError):
    """The promoted checkpoint of the instrument set (the incumbent the gate compares with)
    cannot be loaded: missing or corrupt file, wrong layout, other features. Raised before any
    training; the message says how to fix it."""

    def __init__(self, sha256: str, instrument_set: str, reason: str) -> None:
        self.sha256 = sha256
        self.instrument_set = instrument_set
        self.reason = reason
        super().__init__(
            f"the promoted checkpoint {sha256[:12]} of {instrument_set} cannot be the incumbent: {reason}. "
            "Fix it first: `tradeagent ctl rollback` (the running daemon puts the previous promoted "
            "checkpoint back), `tradeagent ctl promote <sha256 of a candidate>`, or train against no "
            "incumbent with `tradeagent train --promote --no-incumbent ...`"
        )
