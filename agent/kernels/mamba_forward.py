"""Fused inference forward of the network: ``mamba_forward()`` (``mamba_forward.cu``) and its
reference ``mamba_forward_ref()`` (the model's own :func:`agent.model.network.forward`).

The kernel reads one packed float32 buffer (:func:`pack_params`): the model's tensors, weight
matrices transposed to (in, out) so that neighbouring threads read neighbouring outputs,
``A_log`` as it is (the kernels take ``A = -exp(A_log)``; the trainer's kernels update this same
buffer, :mod:`agent.kernels.train`), and the feature normalisation statistics last. Shapes and
offsets are compile-time constants (one compiled module per model shape, cached).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.kernels.loader import cupy, kernel
from agent.model.config import ModelConfig
from agent.model.network import forward
from agent.model.params import block_prefix, param_shapes

__all__ = [
    "LATENCY",
    "THROUGHPUT",
    "VARIANTS",
    "ForwardLayout",
    "Variant",
    "compiled",
    "forward_layout",
    "mamba_forward",
    "mamba_forward_ref",
    "pack_params",
    "shared_bytes",
]


@dataclass(frozen=True, slots=True)
class Variant:
    """One compiled form of the forward (``mamba_forward.cuh``)."""

    name: str
    threads: int
    """Threads per block (one window per block)."""
    tile: int
    """Time steps per matmul work item where weights are not staged."""
    staged: bool
    """Weights copied into shared memory stage by stage (one block a multiprocessor)."""
    adaptive: bool = False
    """Unstaged matmuls shrink their row tile below ``tile`` until every thread has work."""

    def options(self) -> tuple[str, ...]:
        return (
            f"-DMF_THREADS={self.threads}",
            f"-DMF_TG={self.tile}",
            f"-DMF_STAGE={int(self.staged)}",
            f"-DMF_ADAPT={int(self.adaptive)}",
        )


LATENCY = Variant("latency", 512, 4, staged=True)
"""Small batches: every thread of the block on every stage, weights staged with cp.async."""
THROUGHPUT = Variant("throughput", 256, 8, staged=False)
"""Large batches: weights through L1, longer row tiles (more reuse per load), two blocks a
multiprocessor."""
VARIANTS = {v.name: v for v in (LATENCY, THROUGHPUT)}
_ALIGN = 4
"""Every tensor starts on a 16-byte boundary (float4 loads in the kernel)."""


_OPTED_IN: set[tuple[str, tuple[str, ...]]] = set()


def _aligned(pos: int) -> int:
    return -(-pos // _ALIGN) * _ALIGN


@dataclass(frozen=True, slots=True)
class ForwardLayout:
    """Offsets (in floats, multiples of 4) of the packed parameter buffer and the kernel's
    launch shape."""

    offsets: dict[str, int]
    """Global offsets (``OFF_*``) and offsets inside one block (``BLK_*``, plus BLK_STRIDE)."""
    total: int
    """Length of the packed buffer (floats)."""
    shared_floats: int
    """Dynamic shared memory per thread block without staged weights (floats)."""
    staged_floats: int
    """Dynamic shared memory per thread block with staged weights (floats)."""
    options: tuple[str, ...]
    """NVRTC ``-D`` options that fix the shapes and offsets."""


@functools.cache
def forward_layout(cfg: ModelConfig) -> ForwardLayout:
    """The packed layout for ``cfg`` (``n_features`` resolved)."""
    param_shapes(cfg)  # raises ModelError while n_features is unresolved
    d, di, f = cfg.d_model, cfg.d_inner, cfg.n_features
    n_q, n_r = cfg.n_actions * cfg.n_atoms, cfg.return_bins
    block = {
        "BLK_NORM": d,
        "BLK_WIN_T": cfg.in_proj_dim * d,
        "BLK_CONV_W": cfg.conv_dim * cfg.d_conv,
        "BLK_CONV_B": cfg.conv_dim,
        "BLK_DT_BIAS": cfg.n_heads,
        "BLK_A": cfg.n_heads,
        "BLK_D": cfg.n_heads,
        "BLK_GNORM": di,
        "BLK_WOUT_T": di * d,
    }
    offsets: dict[str, int] = {}
    pos = 0
    for name, size in block.items():
        offsets[name] = pos
        pos = _aligned(pos + size)
    offsets["BLK_STRIDE"] = pos
    glob = {
        "OFF_EMB_WT": f * d,
        "OFF_EMB_B": d,
        "OFF_BLOCKS": cfg.n_layers * pos,
        "OFF_FINAL_NORM": d,
        "OFF_Q_WT": d * n_q,
        "OFF_Q_B": n_q,
        "OFF_R_WT": d * n_r,
        "OFF_R_B": n_r,
        "OFF_MEAN": f,
        "OFF_STD": f,
    }
    pos = 0
    for name, size in glob.items():
        offsets[name] = pos
        pos = _aligned(pos + size)
    dims = {
        "MF_K": cfg.window,
        "MF_F": f,
        "MF_D": d,
        "MF_L": cfg.n_layers,
        "MF_DI": di,
        "MF_H": cfg.n_heads,
        "MF_P": cfg.headdim,
        "MF_G": cfg.ngroups,
        "MF_N": cfg.d_state,
        "MF_W": cfg.d_conv,
        "MF_NQ": n_q,
        "MF_NR": n_r,
        "MF_A": cfg.n_actions,
        "MF_ATOMS": cfg.n_atoms,
    }
    options = tuple(f"-D{k}={v}" for k, v in (dims | offsets).items())
    k, ip = cfg.window, cfg.in_proj_dim
    # The SM_* layout of mamba_forward.cuh: activations, logits and probabilities, then the
    # staged in_proj, out_proj (or embedding) and head weights, then the small parameters (each
    # block's norm and its conv_w .. gnorm_w run, the final norm).
    heads = _aligned(n_q) + _aligned(n_r)
    shared = 2 * _aligned(k * d) + _aligned(k * max(ip, f)) + 2 * heads
    small = cfg.n_layers * (_aligned(d) + offsets["BLK_WOUT_T"] - offsets["BLK_CONV_W"]) + _aligned(d)
    staged = (
        shared
        + _aligned(d * ip)
        + _aligned(max(di * d, f * d))
        + _aligned(d * n_q)
        + _aligned(d * n_r)
        + small
    )
    return ForwardLayout(offsets, pos, shared, staged, options)


def shared_bytes(cfg: ModelConfig, variant: Variant) -> int:
    """Dynamic shared memory of one block of ``variant``."""
    layout = forward_layout(cfg)
    return 4 * (layout.staged_floats if variant.staged else layout.shared_floats)


def pack_params(
    params: Mapping[str, npt.ArrayLike],
    cfg: ModelConfig,
    feature_mean: npt.ArrayLike,
    feature_std: npt.ArrayLike,
) -> npt.NDArray[np.float32]:
    """The kernel's packed float32 buffer (host) from the model's parameter dict and the
    checkpoint's normalisation statistics (F,) each. Shapes are those of
    :func:`agent.model.params.param_shapes`; the caller validates them first."""
    layout = forward_layout(cfg)
    off = layout.offsets
    out = np.zeros(layout.total, dtype=np.float32)

    def put(at: int, value: npt.ArrayLike) -> None:
        flat = np.ascontiguousarray(value, dtype=np.float32).ravel()
        out[at : at + flat.size] = flat

    def tr(name: str) -> npt.NDArray[np.float32]:
        return np.asarray(params[name], dtype=np.float32).T

    put(off["OFF_EMB_WT"], tr("embed.W"))
    put(off["OFF_EMB_B"], params["embed.b"])
    for i in range(cfg.n_layers):
        p = block_prefix(i)
        base = off["OFF_BLOCKS"] + i * off["BLK_STRIDE"]
        put(base + off["BLK_NORM"], params[p + "norm_w"])
        put(base + off["BLK_WIN_T"], tr(p + "W_in"))
        put(base + off["BLK_CONV_W"], params[p + "conv_w"])
        put(base + off["BLK_CONV_B"], params[p + "conv_b"])
        put(base + off["BLK_DT_BIAS"], params[p + "dt_bias"])
        put(base + off["BLK_A"], params[p + "A_log"])
        put(base + off["BLK_D"], params[p + "D"])
        put(base + off["BLK_GNORM"], params[p + "gnorm_w"])
        put(base + off["BLK_WOUT_T"], tr(p + "W_out"))
    put(off["OFF_FINAL_NORM"], params["final_norm_w"])
    put(off["OFF_Q_WT"], tr("q.W"))
    put(off["OFF_Q_B"], params["q.b"])
    put(off["OFF_R_WT"], tr("ret.W"))
    put(off["OFF_R_B"], params["ret.b"])
    put(off["OFF_MEAN"], feature_mean)
    put(off["OFF_STD"], feature_std)
    return out


def mamba_forward_ref(
    params: Mapping[str, npt.ArrayLike],
    cfg: ModelConfig,
    window: npt.ArrayLike,
    slots: npt.ArrayLike,
    *,
    feature_mean: npt.ArrayLike,
    feature_std: npt.ArrayLike,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Reference, upcast to float64: the model's forward on the normalised windows of ``slots``.

    window (S, K, F) raw features; slots (B,) in [0, S). Returns q_logits (B, A, atoms) and
    ret_logits (B, bins).
    """
    p64 = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()}
    raw = np.asarray(window, dtype=np.float64)[np.asarray(slots, dtype=np.int64)]
    x = (raw - np.asarray(feature_mean, dtype=np.float64)) / np.asarray(feature_std, dtype=np.float64)
    q, r, _ = forward(p64, cfg, x)
    return q, r


def mamba_forward(
    packed: Any,
    cfg: ModelConfig,
    window: Any,
    slots: Any,
    *,
    q_logits: Any = None,
    ret_logits: Any = None,
    variant: Variant = THROUGHPUT,
) -> tuple[Any, Any]:
    """Device forward (CuPy): packed (total,) float32 from :func:`pack_params` (on the device),
    window (S, K, F) float32, slots (B,) int32 (negative: padded row, outputs unwritten).

    Returns q_logits (B, A * atoms) and ret_logits (B, bins), float32; outputs may be
    preallocated. The engine runs the same forward inside :func:`agent.kernels.decide.decide`.
    """
    cp = cupy()
    rows = slots.shape[0]
    q_logits = cp.empty((rows, cfg.n_actions * cfg.n_atoms), cp.float32) if q_logits is None else q_logits
    ret_logits = cp.empty((rows, cfg.return_bins), cp.float32) if ret_logits is None else ret_logits
    fn, shared = compiled("mamba_forward.cu", "mamba_forward_kernel", cfg, variant)
    if rows:
        fn((rows,), (variant.threads,), (packed, window, slots, q_logits, ret_logits), shared_mem=shared)
    return q_logits, ret_logits


def compiled(file: str, name: str, cfg: ModelConfig, variant: Variant) -> tuple[Any, int]:
    """Kernel ``name`` of ``file`` (which includes ``mamba_forward.cuh``) compiled for ``cfg``
    and ``variant``, opted in to its dynamic shared memory; and that many bytes."""
    options = (*forward_layout(cfg).options, *variant.options())
    fn = kernel(file, name, options=options)
    shared = shared_bytes(cfg, variant)
    if (file, options) not in _OPTED_IN:  # above 48 KiB of shared memory a kernel must opt in, once
        fn.max_dynamic_shared_size_bytes = shared
        _OPTED_IN.add((file, options))
    return fn, shared
