"""Root of the ``agent`` error tree.

``feeds.errors.FeedError`` and ``storage.errors.StorageError`` are the roots of the other
packages; the CLI turns any of them into a clear message and exit code 2.
"""

from __future__ import annotations

__all__ = ["AgentError", "CommandError"]


class AgentError(Exception):
    """Base of errors raised by the ``agent`` package."""


class CommandError(AgentError):
    """A command cannot go on; the message says why and what to do."""
