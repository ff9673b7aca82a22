"""Run the project's CUDA kernels on the CPU (``cuda_emu/cuda_emu.h``), for tests without a GPU.

:func:`module` compiles one ``agent/kernels/*.cu`` file with ``g++`` against the emulation
header, with the same ``-D`` options NVRTC gets, and returns a :class:`Module` whose kernels take
the arguments that CuPy's ``RawKernel`` takes (NumPy arrays in place of CuPy arrays, NumPy
scalars for the scalar parameters). Blocks run one after another, every CUDA thread a fiber, so
the results are those of the device up to floating-point contraction and the order of
reductions that the kernel itself does not fix.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.kernels.loader import KERNEL_DIR

__all__ = ["Module", "available", "module"]

HEADER_DIR = Path(__file__).resolve().parent / "cuda_emu"
_CACHE = Path(tempfile.gettempdir()) / f"tradeagent-cuda-emu-{os.getuid()}"
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+__align__\(\d+\)\s+(\w+)\s+(\w+)\[\];")
_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(MF_CLUSTER_DIMS\s+)?(?:__launch_bounds__\([^)]*\)\s+|MF_BOUNDS\s+)?(\w+)\s*\('
)
"""A kernel's declaration: optional cluster dimensions and launch bounds (or mamba_forward.cuh's
MF_BOUNDS), then its name."""
_SCALARS: dict[type, Any] = {
    np.int32: ctypes.c_int32,
    np.uint32: ctypes.c_uint32,
    np.int64: ctypes.c_int64,
    np.uint64: ctypes.c_uint64,
    np.float32: ctypes.c_float,
    np.float64: ctypes.c_double,
}


def available() -> bool:
    """Whether a C++20 compiler is on PATH."""
    return shutil.which("g++") is not None


def _source(file: str) -> tuple[str, list[str]]:
    """The kernel file made into a host translation unit, and its kernels' names."""
    path = KERNEL_DIR / file
    text = path.read_text(encoding="utf-8")
    kernels = _KERNEL.findall(text)
    body = _EXTERN_SHARED.sub(lambda m: f"{m[1]}* {m[2]} = ({m[1]}*)emu::dynamic_shared();", text)
    # A kernel declared MF_CLUSTER_DIMS (mamba_forward.cuh) runs in clusters of MF_CL blocks.
    exports = "\n".join(f"EMU_EXPORT({name}, {'MF_CL' if dims else 1})" for dims, name in kernels)
    return f'#include "cuda_emu.h"\n#line 1 "{path}"\n{body}\n{exports}\n', [name for _, name in kernels]


class Kernel:
    """One emulated ``__global__`` function, called like ``cupy.RawKernel``."""

    def __init__(self, fn: Any, name: str) -> None:
        self._fn = fn
        self.name = name

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], *, shared_mem: int = 0
    ) -> None:
        dims = (ctypes.c_uint * 6)(
            *(list(grid) + [1] * (3 - len(grid))), *(list(block) + [1] * (3 - len(block)))
        )
        keep: list[Any] = []
        for arg in args:
            if isinstance(arg, np.ndarray):
                if not arg.flags.c_contiguous:
                    raise ValueError(f"{self.name}: array arguments must be C-contiguous")
                keep.append(ctypes.c_void_p(arg.ctypes.data))
            elif isinstance(arg, np.generic) and type(arg) in _SCALARS:
                keep.append(_SCALARS[type(arg)](arg.item()))
            else:
                raise TypeError(f"{self.name}: pass NumPy arrays and NumPy scalars, got {type(arg).__name__}")
        pointers = (ctypes.c_void_p * max(1, len(keep)))(*(ctypes.addressof(k) for k in keep))
        self._fn(dims, ctypes.c_size_t(shared_mem), pointers)


class Module:
    """A compiled kernel file; ``get_function(name)`` as on ``cupy.RawModule``."""

    def __init__(self, library: Path, names: list[str]) -> None:
        self._lib = ctypes.CDLL(str(library))
        self.names = names

    def get_function(self, name: str) -> Kernel:
        if name not in self.names:
            raise KeyError(f"no kernel {name!r} (has {self.names})")
        fn = getattr(self._lib, f"emu_launch_{name}")
        fn.restype = None
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        return Kernel(fn, name)


_LOADED: dict[str, Module] = {}


def module(file: str, options: tuple[str, ...] = ()) -> Module:
    """``file`` (in agent/kernels) compiled for the CPU with ``options`` (``-DNAME=value``),
    cached on disk by the hash of the sources and options."""
    source, names = _source(file)
    headers = "".join(p.read_text(encoding="utf-8") for p in sorted(KERNEL_DIR.glob("*.cuh")))
    headers += (HEADER_DIR / "cuda_emu.h").read_text(encoding="utf-8")
    key = hashlib.sha256("\0".join([source, headers, *options]).encode()).hexdigest()[:20]
    if key in _LOADED:
        return _LOADED[key]
    _CACHE.mkdir(mode=0o700, exist_ok=True)
    library = _CACHE / f"{Path(file).stem}-{key}.so"
    if not library.exists():
        cpp = _CACHE / f"{Path(file).stem}-{key}.cpp"
        cpp.write_text(source, encoding="utf-8")
        flags = [o for o in options if o.startswith("-D")]
        cmd = [
            "g++",
            "-std=c++20",
            "-O1",
            "-g",
            "-fPIC",
            "-shared",
            "-w",
            f"-I{KERNEL_DIR}",
            f"-I{HEADER_DIR}",
        ]
        tmp = library.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run(
            [*cmd, *flags, str(cpp), "-o", str(tmp)], capture_output=True, text=True, check=False
        )
        if result.returncode:
            pytest.fail(f"{file} does not compile for the CPU emulation:\n{result.stderr[-4000:]}")
        tmp.replace(library)
    loaded = Module(library, names)
    _LOADED[key] = loaded
    return loaded
