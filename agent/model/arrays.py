"""Array-module plumbing: the model runs on NumPy or CuPy through one code path.

Every function of :mod:`agent.model` derives its array module ``xp`` from its inputs with
:func:`array_module` and uses only operations that NumPy and CuPy both provide. Selecting
the device is :mod:`agent.gpu`'s job; this module only follows the arrays it is given.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, TypeAlias

import numpy as np

__all__ = ["Array", "Params", "array_module", "to_numpy"]

Array: TypeAlias = Any
"""A ``numpy.ndarray`` or ``cupy.ndarray`` (the checker cannot express "either")."""

Params: TypeAlias = dict[str, Array]
"""Parameters, gradients or optimiser moments: tensor name -> array (see agent.model.params)."""


def _is_cupy(a: object) -> bool:
    return type(a).__module__.startswith("cupy")


def array_module(*arrays: object) -> ModuleType:
    """``cupy`` when any argument is a CuPy array, else ``numpy``."""
    if all(type(a) is np.ndarray for a in arrays):  # the CPU path's common case, decided fast
        return np
    if any(_is_cupy(a) for a in arrays):
        return sys.modules["cupy"]  # a CuPy array exists, so cupy is imported
    return np


def to_numpy(a: Array) -> np.ndarray[Any, Any]:
    """A host copy (CuPy) or the array itself (NumPy)."""
    if _is_cupy(a):
        out: np.ndarray[Any, Any] = a.get()
        return out
    return np.asarray(a)
