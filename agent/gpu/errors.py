"""Errors of the GPU layer and the inference engine.

AgentError
 +-- GpuError                  base of this package's errors
      +-- DeviceUnavailable    ``device = "cuda"`` but no usable CUDA device: fix the install or config
      +-- KernelCompileError   a CUDA source does not compile (a bug or a toolchain mismatch)
      +-- InferenceError       a decision could not be made (bad call or a device failure): stop
      |                        new orders, keep state, report
      +-- ModelLoadError       a checkpoint cannot be served; the running model is untouched
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["DeviceUnavailable", "GpuError", "InferenceError", "KernelCompileError", "ModelLoadError"]


class GpuError(AgentError):
    """Base of the errors of ``agent.gpu`` and ``agent.kernels``."""


class DeviceUnavailable(GpuError):
    """A CUDA device was required but none is usable; the message says how to fix it."""


class KernelCompileError(GpuError):
    """A kernel source failed to compile; the message carries NVRTC's log."""


class InferenceError(GpuError):
    """A decision batch failed. The caller must stop sending new orders; engine state is kept."""


class ModelLoadError(GpuError):
    """A model could not be loaded for serving; the model already serving is unchanged."""
