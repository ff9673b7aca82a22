"""Single-precision matrix products on one CUDA stream through cuBLAS's C API, capturable.

The trainer's update is captured once as a CUDA graph and replayed (:mod:`agent.kernels.train`);
its projections and weight gradients are cuBLAS products. CuPy refuses every cuBLAS call while a
stream captures (its ``cublas.setStream`` raises ``NotImplementedError``), so this module calls
``cublasSgemm_v2`` itself (ctypes) on a handle of its own: bound to one stream and given a
workspace of its own before any capture, as cuBLAS asks of a captured call (NVIDIA's cuBLAS
guide, "CUDA Graphs support"). The library is the ``libcublas`` CuPy already loaded, found in
the process's memory map. Products are deterministic (cuBLAS's default, atomics not allowed).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import weakref
from pathlib import Path
from typing import Any

from agent.kernels.errors import BlasError
from agent.kernels.loader import cupy

__all__ = ["StreamGemm"]

_OP_N, _OP_T = 0, 1
_WORKSPACE = 32 << 20
"""Bytes of the handle's own workspace (cuBLAS's documented ceiling for Hopper is 32 MiB)."""


@functools.cache
def _libcublas() -> ctypes.CDLL:
    """The ``libcublas`` shared library of CuPy's cuBLAS bindings (already loaded)."""
    importlib.import_module("cupy_backends.cuda.libs.cublas")
    maps = Path("/proc/self/maps")
    paths = {line.split()[-1] for line in maps.read_text().splitlines() if "/libcublas.so" in line}
    if len(paths) != 1:
        raise BlasError(f"cannot find the one libcublas CuPy loaded (found {sorted(paths) or 'none'})")
    lib = ctypes.CDLL(paths.pop())
    lib.cublasSgemm_v2.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BlasError(f"cuBLAS {what} failed with status {status}")


def _operand(x: Any, what: str) -> tuple[int, int]:
    """cuBLAS's (operation, leading dimension) of a float32 matrix view that is row-major (unit
    column stride: a C-contiguous matrix, a block of columns, every n-th row) or column-major
    (unit row stride: the transpose of one of those), for the column-major product that computes
    the row-major one."""
    rows, cols = x.shape
    s0, s1 = (stride // x.itemsize for stride in x.strides)
    if s1 == 1 or cols == 1:
        return _OP_N, max(s0, cols, 1) if rows > 1 else max(cols, 1)
    if s0 == 1 or rows == 1:
        return _OP_T, max(s1, rows, 1) if cols > 1 else max(rows, 1)
    raise BlasError(f"gemm {what} {x.shape} with strides {x.strides} has no unit stride")


class StreamGemm:
    """``gemm(a, b, out, accumulate=False)``: ``out = a @ b`` (``out += a @ b`` when
    ``accumulate``) for float32 CuPy matrices, enqueued on ``stream`` (the stream current at
    construction by default) and valid inside a stream capture there. Each operand is a view with
    one unit stride (C- or F-contiguous, a block of columns, every n-th row, a transpose of
    those: read as it lies); ``out`` has unit column stride."""

    def __init__(self, stream: Any | None = None) -> None:
        cp = cupy()
        lib = _libcublas()
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "handle creation")
        self._finalizer = weakref.finalize(self, lib.cublasDestroy_v2, handle)
        stream = stream if stream is not None else cp.cuda.get_current_stream()
        _check(lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream.ptr)), "setStream")
        self._workspace = cp.empty(_WORKSPACE, dtype=cp.uint8)
        _check(
            lib.cublasSetWorkspace_v2(
                handle, ctypes.c_void_p(self._workspace.data.ptr), ctypes.c_size_t(_WORKSPACE)
            ),
            "setWorkspace",
        )
        self._lib, self._handle, self.stream = lib, handle, stream
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def __call__(self, a: Any, b: Any, out: Any, accumulate: bool = False) -> None:
        m, k = a.shape
        n = b.shape[1]
        if b.shape[0] != k or out.shape != (m, n):
            raise BlasError(f"gemm shapes {a.shape} @ {b.shape} -> {out.shape} do not match")
        op_c, ldc = _operand(out, "output")
        if op_c != _OP_N:
            raise BlasError(f"gemm output {out.shape} with strides {out.strides} is not row-major")
        # Row-major out = a b is column-major out^T = b^T a^T: a row-major (r, c) matrix is its
        # transpose column-major (no operation), a column-major one is itself (transposed).
        op_b, ldb = _operand(b, "operand b")
        op_a, lda = _operand(a, "operand a")
        status = self._lib.cublasSgemm_v2(
            self._handle,
            op_b,
            op_a,
            n,
            m,
            k,
            ctypes.byref(self._one),
            b.data.ptr,
            ldb,
            a.data.ptr,
            lda,
            ctypes.byref(self._one if accumulate else self._zero),
            out.data.ptr,
            ldc,
        )
        _check(status, "sgemm")
