"""Errors of the trainer.

::

    AgentError
    └── TrainError           training cannot run on this data or configuration: fix the input
        └── TrainTimeout     the --max-minutes limit ended the run; nothing was registered
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["TrainError", "TrainTimeout"]


class TrainError(AgentError):
    """Training cannot run on this data or configuration; the message says why."""


class TrainTimeout(TrainError):
    """The time limit ended training cleanly: no candidate was registered, nothing half-written."""
