"""Errors of the kernel package.

::

    AgentError
    ├── KernelCompileError   a CUDA source does not compile (a bug or a toolchain mismatch)
    └── BlasError            a cuBLAS call failed or got operands it cannot take

The inference engine (:mod:`agent.gpu.engine`) reports a kernel that does not compile as the
:class:`~agent.gpu.errors.ModelLoadError` of the checkpoint it was building for.
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["BlasError", "KernelCompileError"]


class KernelCompileError(AgentError):
    """A kernel source failed to compile; the message carries NVRTC's log."""


class BlasError(AgentError):
    """A cuBLAS product failed (its status in the message) or got operands it cannot take."""
