"""The kernel loader on a device: a changed header is compiled afresh, never served from CuPy's
on-disk kernel cache (which keys a module by its source text, not by what it includes)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from agent.kernels import loader

pytestmark = pytest.mark.gpu

_SOURCE = """#include "value.cuh"
extern "C" __global__ void value_kernel(int* out) { *out = VALUE; }
"""


def _value(cp: ModuleType) -> int:
    out = cp.zeros(1, dtype=cp.int32)
    loader.kernel("value.cu", "value_kernel")((1,), (1,), (out,))
    return int(out.get()[0])


def test_a_changed_header_is_compiled_afresh(
    cp: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "value.cu").write_text(_SOURCE)
    monkeypatch.setattr(loader, "KERNEL_DIR", kernels)
    got = []
    for value in (1, 2):
        (kernels / "value.cuh").write_text(f"#define VALUE {value}\n")
        loader._module.cache_clear()  # a new process: only the disk cache remembers
        loader._headers_digest.cache_clear()
        got.append(_value(cp))
    loader._module.cache_clear()
    loader._headers_digest.cache_clear()
    assert got == [1, 2], f"the kernel read VALUE {got[1]} after the header said 2"
