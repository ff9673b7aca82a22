"""Single-precision matrix products on one CUDA stream, capturable: tall products on the tensor
cores (``gemm.cu``), the rest through cuBLAS's C API.

The trainer's update is captured once as a CUDA graph and replayed (:mod:`agent.kernels.train`).
Its projections multiply the batch's B * K rows by a weight matrix: many rows, a short inner
dimension, an output written once. cuBLAS's sgemm runs those with SIMT float32 tiles at about a
sixth of the memory's bandwidth; ``gemm.cu`` runs them on the tensor cores in three TF32 passes
(3xTF32: float32's accuracy), 1.2-1.4x faster on the H200 at the update's 131,072 rows. The
weight gradients (a transposed left operand: sums over the rows) and the products with few rows
stay on cuBLAS.

CuPy refuses every cuBLAS call while a stream captures (its ``cublas.setStream`` raises
``NotImplementedError``), so this module calls ``cublasSgemm_v2`` itself (ctypes) on a handle of its
own: bound to one stream and given a workspace of its own before any capture, as cuBLAS asks of a
captured call (NVIDIA's cuBLAS guide, "CUDA Graphs support"). The library is the ``libcublas`` CuPy
already loaded, found in the process's memory map. Products are deterministic (cuBLAS's default,
atomics not allowed).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from agent.kernels.errors import BlasError
from agent.kernels.loader import cupy, kernel

__all__ = ["StreamGemm", "on_tensor_cores"]

_OP_N, _OP_T = 0, 1
_TC_ROWS = (16384, 65535 * 128)
"""Rows of a product that runs on ``gemm.cu``: from where it is faster than cuBLAS (measured on
the H200: 1.2-1.4x at the update's 131,072 rows, even at 16,384, slower below) to what its grid
holds."""
_TC_TILE = (128, 64)
"""``gemm.cu``'s tile of the output (GM_BM, GM_BN), computed by 128 threads."""
_TC_THREADS = 128
_TC_SLICE, _TC_STAGES = 16, 4
"""The inner dimension's slices (GM_BK) and how many a block holds (GM_STAGES: three in flight
while the tensor cores work on the fourth)."""
_TC_SHARED = (
    4
    * _TC_STAGES
    * (_TC_TILE[0] * (_TC_SLICE + 4) + max(_TC_SLICE * (_TC_TILE[1] + 8), _TC_TILE[1] * (_TC_SLICE + 4)))
)
"""Dynamic shared memory of ``gemm.cu`` (bytes): its padded slices of A (GM_BM x (GM_BK + 4)) and
of B (the larger of GM_BK x (GM_BN + 8) and its transpose's GM_BN x (GM_BK + 4)), a stage each."""


@functools.cache
def _tc_kernel(name: str) -> Any:
    product = kernel("gemm.cu", name, options=(f"-DGM_BK={_TC_SLICE}", f"-DGM_STAGES={_TC_STAGES}"))
    product.max_dynamic_shared_size_bytes = _TC_SHARED
    return product


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


def on_tensor_cores(a: Any, b: Any) -> bool:
    """Whether ``StreamGemm`` computes ``a @ b`` with ``gemm.cu``: a row-major ``a`` (unit column
    stride) of many rows, a non-empty product, and every row of both operands on a 16-byte
    boundary (``gemm.cu`` copies 16 bytes at a time)."""
    op_a, lda = _operand(a, "operand a")
    _, ldb = _operand(b, "operand b")
    return _takes(a, b, op_a, lda, ldb)


def _takes(a: Any, b: Any, op_a: int, lda: int, ldb: int) -> bool:
    """:func:`on_tensor_cores` given the operands' forms (:func:`_operand`)."""
    (m, k), n = a.shape, b.shape[1]
    return (
        op_a == _OP_N
        and _TC_ROWS[0] <= m <= _TC_ROWS[1]
        and k > 0
        and n > 0
        and all(ld % 4 == 0 and x.data.ptr % 16 == 0 for ld, x in ((lda, a), (ldb, b)))
    )


class StreamGemm:
    """``gemm(a, b, out, accumulate=False)``: ``out = a @ b`` (``out += a @ b`` when
    ``accumulate``) for float32 CuPy matrices, enqueued on ``stream`` (the stream current at
    construction by default) and valid inside a stream capture there. Each operand is a view with
    one unit stride (C- or F-contiguous, a block of columns, every n-th row, a transpose of
    those: read as it lies); ``out`` has unit column stride. The products
    :func:`on_tensor_cores` picks run on ``gemm.cu`` (3xTF32), every other one on cuBLAS; both
    are deterministic."""

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
        if _takes(a, b, op_a, lda, ldb):
            bm, bn = _TC_TILE
            product = _tc_kernel("gemm_tf32x3_nn" if op_b == _OP_N else "gemm_tf32x3_nt")
            with self.stream:
                product(
                    (-(-n // bn), -(-m // bm)),
                    (_TC_THREADS,),
                    (
                        a,
                        np.int32(lda),
                        b,
                        np.int32(ldb),
                        out,
                        np.int32(ldc),
                        np.int32(m),
                        np.int32(n),
                        np.int32(k),
                        np.int32(accumulate),
                    ),
                    shared_mem=_TC_SHARED,
                )
            return
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
