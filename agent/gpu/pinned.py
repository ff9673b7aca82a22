"""Pinned, mapped host arrays: the engine's only channel between the host and the device.

``cudaHostAlloc(..., cudaHostAllocMapped)`` memory is page-locked and, with unified virtual
addressing (every 64-bit Linux CUDA platform), usable by kernels at the same address. The host
writes inputs into a NumPy view and reads outputs from it; kernels (and captured CUDA graphs)
read and write the same bytes through a CuPy view, or a graph copies them to device memory
first where the kernel's reads over the bus would cost more than the copy
(:data:`agent.gpu.cuda_runner.STAGED_ROWS`). After the one stream synchronisation of a decision
the outputs are already in host memory.

CuPy has no ``cudaHostGetDevicePointer``; the allocation is wrapped with
``cupy.cuda.UnownedMemory`` + ``MemoryPointer`` (NOTES.md).
"""

from __future__ import annotations

import ctypes
import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.kernels.loader import cupy

__all__ = ["MappedArray", "mapped_empty"]


@dataclass(frozen=True, slots=True)
class MappedArray:
    """One pinned mapped allocation seen from both sides."""

    host: npt.NDArray[Any]
    """NumPy view (host reads and writes)."""
    device: Any
    """``cupy.ndarray`` view of the same bytes (kernel arguments)."""
    _owner: object
    """Keeps the allocation alive; it is freed when the last view holder drops it."""


class _HostAllocation:
    """Owns one ``cudaHostAlloc`` pointer and frees it with ``cudaFreeHost`` on collection."""

    def __init__(self, nbytes: int) -> None:
        runtime = cupy().cuda.runtime
        flags = getattr(runtime, "hostAllocMapped", 2)  # cudaHostAllocMapped
        self.ptr: int = runtime.hostAlloc(nbytes, flags)
        self.nbytes = nbytes
        weakref.finalize(self, runtime.freeHost, self.ptr)


def mapped_empty(shape: tuple[int, ...], dtype: npt.DTypeLike) -> MappedArray:
    """An uninitialised pinned mapped array of ``shape`` and ``dtype`` (needs a CUDA device)."""
    cp = cupy()
    dt = np.dtype(dtype)
    nbytes = max(1, math.prod(shape) * dt.itemsize)
    alloc = _HostAllocation(nbytes)
    buffer = (ctypes.c_char * nbytes).from_address(alloc.ptr)
    host: npt.NDArray[Any] = np.frombuffer(memoryview(buffer), dtype=dt, count=math.prod(shape)).reshape(
        shape
    )
    memory = cp.cuda.UnownedMemory(alloc.ptr, nbytes, alloc, cp.cuda.Device().id)
    device = cp.ndarray(shape, dtype=dt, memptr=cp.cuda.MemoryPointer(memory, 0))
    return MappedArray(host, device, alloc)
