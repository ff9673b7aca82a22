"""The trainer's stream products (agent.kernels.blas.StreamGemm) on a CUDA device: every operand
form the update uses (contiguous, transposed, a block of columns, every K-th row, a transposed
strided view), products added to the output, and the same products captured in a CUDA graph and
replayed, against NumPy in float64."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from agent.kernels.blas import StreamGemm, on_tensor_cores
from agent.kernels.errors import BlasError

pytestmark = pytest.mark.gpu

K = 4
"""Rows a window (every K-th row is a window's last step)."""

Case = tuple[str, Any, Any, Any, bool]
"""(name, a, b, out, accumulate)."""


def _cases(cp: ModuleType, rng: np.random.Generator) -> list[Case]:
    def r(*shape: int) -> Any:
        return cp.asarray(rng.normal(size=shape).astype(np.float32))

    u, w, g = r(8 * K, 6), r(6, 10), r(8 * K, 10)
    zx = cp.zeros((8 * K, 10), dtype=np.float32)
    gu = r(8 * K, 6)
    return [
        ("contiguous", u, w, cp.zeros((8 * K, 10), dtype=np.float32), False),
        ("transposed a", u.T, g, cp.zeros((6, 10), dtype=np.float32), False),
        ("transposed b", g, w.T, cp.zeros((8 * K, 6), dtype=np.float32), False),
        ("column block", u, w[:, 3:], zx[:, 3:], False),
        ("every K-th row", u[K - 1 :: K], w[:, :3], zx[K - 1 :: K, :3], False),
        ("strided transposes", u[K - 1 :: K].T, g[K - 1 :: K, :3], cp.zeros((6, 3), dtype=np.float32), False),
        ("accumulate", g[K - 1 :: K, :3], w[:, :3].T, gu[K - 1 :: K], True),
    ]


def _want(a: Any, b: Any, out: Any, accumulate: bool) -> np.ndarray:
    a64, b64 = (np.asarray(x.get(), dtype=np.float64) for x in (a, b))
    base = np.asarray(out.get(), dtype=np.float64) if accumulate else 0.0
    return base + a64 @ b64


def _run(
    cp: ModuleType, make: Callable[[], list[Case]], captured: bool
) -> tuple[list[Case], list[np.ndarray]]:
    """The cases ``make`` builds, each product enqueued on one stream's ``StreamGemm`` (captured
    as a graph and launched when ``captured``), and what NumPy computes in float64 beforehand."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        gemm = StreamGemm(stream)
        cases = make()
        wants = [_want(a, b, out, acc) for _, a, b, out, acc in cases]
        if captured:
            stream.begin_capture()
        for _, a, b, out, acc in cases:
            gemm(a, b, out, accumulate=acc)
        if captured:
            stream.end_capture().launch(stream)
        stream.synchronize()
    return cases, wants


@pytest.mark.parametrize("captured", [False, True], ids=["direct", "graph"])
def test_products_of_every_operand_form(cp: ModuleType, captured: bool) -> None:
    rng = np.random.default_rng(1)
    cases, wants = _run(cp, lambda: _cases(cp, rng), captured)
    for (name, _, _, out, _), want in zip(cases, wants, strict=True):
        np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_an_operand_without_a_unit_stride_is_refused(cp: ModuleType) -> None:
    a = cp.ones((8, 8), dtype=np.float32)
    gemm = StreamGemm()
    with pytest.raises(BlasError, match="no unit stride"):
        gemm(a[::2, ::2], a[:4, :4], cp.zeros((4, 4), dtype=np.float32))
    with pytest.raises(BlasError, match="not row-major"):
        gemm(a[:4, :4], a[:4, :4], cp.zeros((4, 4), dtype=np.float32).T)


def _tall_cases(cp: ModuleType, rng: np.random.Generator) -> list[Case]:
    """The update's projections over B * K rows (the products ``gemm.cu`` takes: many rows, a
    row-major left operand), and one with every edge off the kernel's tiles (rows, columns and
    the inner dimension not multiples of 128, 64 and 16)."""

    def r(*shape: int) -> Any:
        return cp.asarray(rng.normal(size=shape).astype(np.float32))

    def z(*shape: int) -> Any:
        return cp.zeros(shape, dtype=np.float32)

    rows, d, ip, di = 16400 * K, 64, 296, 128
    u, w_in, w_out, o = r(rows, d), r(d, ip), r(di, d), r(rows, di)
    zx, gzx = z(rows, ip), r(rows, ip)
    gu = r(rows, d)
    odd_a, odd_b = r(16421, 72), r(70, 48)
    return [
        ("in_proj", u, w_in, zx, False),
        ("column block", u, w_in[:, di:], zx[:, di:], False),
        ("out_proj", o, w_out, z(rows, d), False),
        ("transposed b", gzx, w_in.T, z(rows, d), False),
        ("transposed column block", gzx[:, di:], w_in[:, di:].T, z(rows, d), False),
        ("every K-th row", u[K - 1 :: K], w_in[:, :di], zx[K - 1 :: K, :di], False),
        ("accumulate", gzx[:, :di], w_in[:, :di].T, gu, True),
        ("odd edges", odd_a[:, :70], odd_b[:, :45], z(16421, 45), False),
    ]


@pytest.mark.parametrize("captured", [False, True], ids=["direct", "graph"])
def test_tall_products_on_the_tensor_cores_keep_float32_accuracy(cp: ModuleType, captured: bool) -> None:
    """3xTF32 within float32's rounding of the sums: 1e-5 relative and 1e-5 sqrt(k) absolute
    (a single TF32 pass, 10 bits of mantissa, misses by ~5e-3 at k = 296)."""
    rng = np.random.default_rng(2)
    cases, wants = _run(cp, lambda: _tall_cases(cp, rng), captured)
    for name, a, b, _, _ in cases:
        assert on_tensor_cores(a, b), name
    for (name, a, _, out, _), want in zip(cases, wants, strict=True):
        scale = np.sqrt(a.shape[1])
        np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_what_the_tensor_cores_take(cp: ModuleType) -> None:
    """Few rows, a transposed left operand, or rows off 16-byte boundaries go to cuBLAS."""
    a = cp.zeros((16384, 64), dtype=np.float32)
    w = cp.zeros((64, 64), dtype=np.float32)
    assert on_tensor_cores(a, w)
    assert not on_tensor_cores(a[:16383], w)
    assert on_tensor_cores(a[:, :62], w[:62])  # a short inner dimension: rows still aligned
    assert not on_tensor_cores(cp.zeros((64, 16384), dtype=np.float32).T, w)
    assert not on_tensor_cores(a[:, 1:], w[1:])
    assert not on_tensor_cores(a, w[:, 1:])


def test_tall_products_are_deterministic(cp: ModuleType) -> None:
    rng = np.random.default_rng(3)
    a = cp.asarray(rng.normal(size=(16384, 296)).astype(np.float32))
    b = cp.asarray(rng.normal(size=(64, 296)).astype(np.float32))
    gemm = StreamGemm()
    first, second = (cp.zeros((16384, 64), dtype=np.float32) for _ in range(2))
    gemm(a, b.T, first)
    gemm(a, b.T, second)
    assert bool((first == second).all())
