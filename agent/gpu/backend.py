"""Device selection: ``device = "auto" | "cpu" | "cuda"`` (DESIGN section 6).

* ``cpu``: NumPy, always.
* ``cuda``: CuPy on a usable CUDA device, else :class:`DeviceUnavailable` with how to fix it;
  never a silent fallback.
* ``auto``: CuPy when a device is usable, else NumPy; the choice and its reason are logged.

"Usable" means: ``cupy`` imports, ``cupy.cuda.is_available()`` is true, and one tiny
allocation succeeds (a machine without a driver can import CuPy and fail only at the first
allocation). CuPy is an optional extra (``tradeagent[gpu]`` or ``[gpu13]``); it is imported
only here and in code reached through a CUDA backend.
"""

from __future__ import annotations

import functools
import importlib
import logging
import types
from dataclasses import dataclass
from typing import Literal

import numpy as np

from agent.gpu.errors import DeviceUnavailable

__all__ = ["Backend", "DeviceKind", "cuda_probe", "select_backend"]

log = logging.getLogger(__name__)

DeviceKind = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True, slots=True)
class Backend:
    """The array module that the model, the policy and the engine compute with."""

    kind: Literal["cpu", "cuda"]
    xp: types.ModuleType
    """``numpy`` or ``cupy``."""
    description: str
    """Human-readable device name, for logs and benchmark output."""

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"


_CPU = Backend("cpu", np, "NumPy on the CPU")


@functools.cache
def cuda_probe() -> tuple[Backend | None, str]:
    """Look for a usable CUDA device once per process.

    Returns:
        (backend, reason): the CuPy backend on success, else ``None`` and why not.
    """
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:
        return None, f"CuPy is not installed ({exc})"
    try:
        if not cupy.cuda.is_available():
            return None, "CuPy found no CUDA device (cupy.cuda.is_available() is false)"
        probe = cupy.zeros(1, dtype=cupy.float32)
        probe += 1
        cupy.cuda.Stream.null.synchronize()
        device = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception as exc:  # any CUDA runtime/driver failure means "not usable"
        return None, f"the CUDA device is not usable: {type(exc).__name__}: {exc}"
    return Backend("cuda", cupy, f"CuPy on CUDA device {device.id} ({name})"), "usable"


def select_backend(device: DeviceKind) -> Backend:
    """The backend for ``device`` (``agent.config.Config.device``).

    Raises:
        DeviceUnavailable: ``device == "cuda"`` and no usable CUDA device.
    """
    if device == "cpu":
        return _CPU
    if device not in ("auto", "cuda"):
        raise DeviceUnavailable(f'device = "{device}" is not one of "auto", "cpu", "cuda"')
    backend, reason = cuda_probe()
    if backend is not None:
        if device == "auto":
            log.info("device auto: using %s", backend.description)
        return backend
    if device == "cuda":
        raise DeviceUnavailable(
            f'device = "cuda" but {reason}. Install the GPU extra that matches the CUDA driver '
            "(pip install 'tradeagent[gpu]' for CUDA 12, 'tradeagent[gpu13]' for CUDA 13), check "
            'the NVIDIA driver with nvidia-smi, or set device = "cpu" (TRADEAGENT__DEVICE=cpu).'
        )
    log.info("device auto: using NumPy on the CPU because %s", reason)
    return _CPU
