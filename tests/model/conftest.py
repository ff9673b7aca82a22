"""Fixtures of the model tests: every test taking ``xp`` runs on NumPy, and on CuPy too
when a CUDA device is usable (the same test code checks both array modules)."""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np
import pytest

from agent.model import ModelConfig


def _cupy_if_usable() -> ModuleType | None:
    try:
        cupy = importlib.import_module("cupy")
        if not cupy.cuda.is_available():
            return None
        cupy.zeros(1).sum()
    except Exception:  # no wheel, no driver, no device: the CuPy variant is skipped
        return None
    return cupy


_CUPY = _cupy_if_usable()


@pytest.fixture(params=["numpy", "cupy"])
def xp(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "numpy":
        return np
    if _CUPY is None:
        pytest.skip("CuPy with a usable CUDA device is not available")
    return _CUPY


TINY = ModelConfig(
    n_features=3,
    window=5,
    d_model=8,
    n_layers=2,
    expand=2,
    headdim=4,
    d_state=3,
    ngroups=2,
    d_conv=4,
    n_atoms=7,
    v_min=-2.0,
    v_max=2.0,
    return_bins=5,
    return_max_ticks=2.0,
)
"""Small enough for finite differences over every parameter entry: K > W, G = 2."""
