"""Errors of the model package.

::

    AgentError
    └── ModelError            bad shapes, bad configuration, non-finite values: stop, fix input
        ├── CheckpointError   a checkpoint is corrupt, has another hash or another layout
        └── NonFiniteError    NaN/Inf in gradients or losses: the training step is rejected
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["CheckpointError", "ModelError", "NonFiniteError"]


class ModelError(AgentError):
    """The model cannot run on this input or configuration; the message says why."""


class CheckpointError(ModelError):
    """A checkpoint cannot be used (corrupt, wrong sha256, other layout); nothing was changed."""


class NonFiniteError(ModelError):
    """A loss or gradient is NaN or infinite; the update was not applied."""
