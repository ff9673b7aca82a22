"""The trainer's stream products (agent.kernels.blas.StreamGemm) on a CUDA device: every operand
form the update uses (contiguous, transposed, a block of columns, every K-th row, a transposed
strided view), products added to the output, and the same products captured in a CUDA graph and
replayed, against NumPy in float64."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from agent.kernels.blas import StreamGemm
from agent.kernels.errors import BlasError

pytestmark = pytest.mark.gpu

K = 4
"""Rows a window (every K-th row is a window's last step)."""


def _cases(cp: ModuleType, rng: np.random.Generator) -> list[tuple[str, Any, Any, Any, bool]]:
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


@pytest.mark.parametrize("captured", [False, True], ids=["direct", "graph"])
def test_products_of_every_operand_form(cp: ModuleType, captured: bool) -> None:
    rng = np.random.default_rng(1)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        gemm = StreamGemm(stream)
        cases = _cases(cp, rng)
        wants = [_want(a, b, out, acc) for _, a, b, out, acc in cases]
        if captured:
            stream.begin_capture()
        for _, a, b, out, acc in cases:
            gemm(a, b, out, accumulate=acc)
        if captured:
            stream.end_capture().launch(stream)
        stream.synchronize()
    for (name, _, _, out, _), want in zip(cases, wants, strict=True):
        np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_an_operand_without_a_unit_stride_is_refused(cp: ModuleType) -> None:
    a = cp.ones((8, 8), dtype=np.float32)
    gemm = StreamGemm()
    with pytest.raises(BlasError, match="no unit stride"):
        gemm(a[::2, ::2], a[:4, :4], cp.zeros((4, 4), dtype=np.float32))
    with pytest.raises(BlasError, match="not row-major"):
        gemm(a[:4, :4], a[:4, :4], cp.zeros((4, 4), dtype=np.float32).T)
