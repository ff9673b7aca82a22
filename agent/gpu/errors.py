"""Errors of the GPU layer and the inference engine.

AgentError
 +-- GpuError                  base of this package's errors
      +-- DeviceUnavailable    ``device = "cuda"`` but no usable CUDA device: fix the install or config
      +-- InferenceError       a decision could not be made (bad call or a device failure): stop
      |                        new orders, keep state, report
      +-- ModelLoadError       a checkpoint cannot be served; the running model is untouched

A CUDA source that does not compile is :class:`agent.kernels.errors.KernelCompileError`, raised
by the kernel loader; the engine reports it as the :class:`ModelLoadError` of the checkpoint it
was building for.
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["DeviceUnavailable", "GpuError", "InferenceError", "ModelLoadError"]


class GpuError(AgentError):
    """Base of the errors of ``agent.gpu``."""


class DeviceUnavailable(GpuError):
    """A CUDA device was required but none is usable; the message says how to fix it."""


class InferenceError(GpuError):
    """A decision batch failed. The caller must stop sending new orders; engine state is kept."""


class ModelLoadError(GpuError):
    """A model could not be loaded for serving; the model already serving is unchanged."""
