"""The one loader of the CUDA sources in this package.

Each ``*.cu`` file ships as package data beside this module and is compiled once per process
with ``cupy.RawModule`` (NVRTC), then cached. The source is prefixed with a ``#line`` directive
naming the real file, so a compile error points at the line to fix; the kernel directory is on
the include path for shared headers such as ``philox.cuh``. CuPy's on-disk kernel cache keys a
module by its source text and options, not by the headers it includes, so the source also
carries a digest of every header here: a changed header (an upgrade) compiles afresh instead of
loading a stale binary.

CuPy is imported only when a kernel is first asked for: importing this module costs nothing on
the CPU path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from pathlib import Path
from typing import Any

from agent.kernels.errors import KernelCompileError

__all__ = ["KERNEL_DIR", "cupy", "kernel"]

KERNEL_DIR = Path(__file__).resolve().parent


def cupy() -> Any:
    """The ``cupy`` module, imported on first use (it is an optional extra)."""
    return importlib.import_module("cupy")


@functools.cache
def _headers_digest() -> str:
    digest = hashlib.sha256()
    for header in sorted(KERNEL_DIR.glob("*.cuh")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def _module(file: str, options: tuple[str, ...]) -> Any:
    cp = cupy()
    path = KERNEL_DIR / file
    try:
        text = path.read_text(encoding="utf-8")
        headers = _headers_digest()
    except OSError as exc:
        raise KernelCompileError(f"kernel source {path} cannot be read: {exc}") from exc
    source = f'// headers {headers}\n#line 1 "{path}"\n{text}'
    module = cp.RawModule(code=source, options=("-std=c++17", f"-I{KERNEL_DIR}", *options))
    try:
        module.compile()
    except cp.cuda.compiler.CompileException as exc:
        raise KernelCompileError(f"{file} does not compile:\n{exc}") from exc
    return module


def kernel(file: str, name: str, *, options: tuple[str, ...] = ()) -> Any:
    """The compiled ``__global__`` function ``name`` of ``file`` (a ``cupy.RawKernel``).

    Args:
        file: source file name in this package, e.g. ``"decide.cu"``.
        name: ``extern "C"`` kernel name.
        options: extra NVRTC options (e.g. ``("--fmad=false",)`` where bit parity with the
            NumPy reference matters); each distinct set compiles its own module.
    """
    return _module(file, options).get_function(name)
