"""Fixtures of the kernel tests that run on the CPU emulation of CUDA (tests/support/cuda_emu).

These tests compile the project's ``.cu`` files with ``g++`` and hold their arithmetic against
the NumPy references in CI, where there is no GPU; tests/gpu runs the same kernels on a device.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.conftest import skip_or_fail
from tests.support import cuda_emu


@pytest.fixture(scope="session")
def emu() -> ModuleType:
    """The emulation module (without g++: skipped locally, a failure under CI=true)."""
    if not cuda_emu.available():
        skip_or_fail("g++, for the CPU emulation of the CUDA kernels")
    return cuda_emu
