"""Errors of the control link.

ControlError (AgentError)
 +-- ControlUnreachable   no daemon answers at the endpoint (not running, refused, no permission)
 +-- ControlRefused       the daemon answered and refused the command (the message says why)
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["ControlError", "ControlRefused", "ControlUnreachable"]


class ControlError(AgentError):
    """Base of control-link errors."""


class ControlUnreachable(ControlError):
    """No answer from the daemon within the timeout, or the socket may not be opened."""


class ControlRefused(ControlError):
    """The daemon refused the command."""
