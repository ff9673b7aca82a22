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
    "CLUSTER",
    "LATENCY",
    "PAIR",
    "TENSOR",
    "THROUGHPUT",
    "VARIANTS",
    "ForwardLayout",
    "Variant",
    "cluster_ranks",
    "compiled",
    "forward_layout",
    "mamba_forward",
    "mamba_forward_ref",
    "pack_params",
    "shared_bytes",
]


MAX_CLUSTER = 8
"""The portable thread-block cluster size limit."""


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
    split: bool = False
    """A window is split over a thread-block cluster, one rank a share of the heads
    (:func:`cluster_ranks`)."""
    ranks: int = MAX_CLUSTER
    """The most blocks a split window's cluster may take."""
    fill: int = 1
    """Staged (and adaptive) matmuls take the longest row tile whose work items still occupy
    ``threads / fill`` threads: above 1, fewer threads each reuse a weight over more rows."""
    blocks: int = 0
    """Blocks a multiprocessor the decision kernel's registers must allow (its launch bounds:
    the compiler caps each thread's registers to fit that many); 0 leaves it to the compiler."""
    tensor: bool = False
    """The projections over the window run on the tensor cores (3xTF32; devices of compute
    capability 8.0 and above)."""

    def options(self) -> tuple[str, ...]:
        return (
            f"-DMF_THREADS={self.threads}",
            f"-DMF_TG={self.tile}",
            f"-DMF_STAGE={int(self.staged)}",
            f"-DMF_ADAPT={int(self.adaptive)}",
            f"-DMF_FILL={self.fill}",
            f"-DMF_MINB={self.blocks}",
            f"-DMF_TC={int(self.tensor)}",
        )


LATENCY = Variant("latency", 512, 4, staged=True, fill=2)
"""Small batches: every thread of the block on every stage, weights staged with cp.async."""
CLUSTER = Variant("cluster", 256, 4, staged=True, split=True, fill=2, ranks=4)
"""The fewest rows: each window on a cluster of (up to) four blocks, one a multiprocessor, each
rank staging and computing its heads' share of every layer, the residual stream reduced across
the cluster through distributed shared memory."""
PAIR = Variant("pair", 512, 4, staged=True, split=True, fill=2, ranks=2)
"""A few dozen rows: the cluster form on two blocks a window, 512 threads each (rows x 4 blocks
would no longer be resident at once)."""
THROUGHPUT = Variant("throughput", 256, 4, staged=False, blocks=4)
"""Large batches: weights through L1, four blocks a multiprocessor (as many as their shared
memory allows; registers capped at 64 a thread) to hide the scan's and the loads' latency."""
TENSOR = Variant("tensor", 256, 4, staged=False, blocks=4, tensor=True)
"""Large batches on devices with TF32 tensor cores: the throughput form with its projections
over the window (embedding, in_proj, out_proj) as warp-level 3xTF32 matrix multiplies, the
weights split into TF32 parts as they are read."""
VARIANTS = {v.name: v for v in (LATENCY, CLUSTER, PAIR, THROUGHPUT, TENSOR)}
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


def cluster_ranks(cfg: ModelConfig, variant: Variant) -> int:
    """Blocks a window of ``variant`` takes: 1, or for a split variant the largest cluster
    (<= ``variant.ranks``, at most :data:`MAX_CLUSTER`) whose ranks hold whole heads of one
    group each (it divides the heads and the groups divide it), for a ``d_model`` that is a
    multiple of 4."""
    if variant.split:
        for ranks in (MAX_CLUSTER, 4, 2):
            fits = ranks <= variant.ranks and cfg.n_heads % ranks == 0 and ranks % cfg.ngroups == 0
            if fits and cfg.d_model % 4 == 0:
                return ranks
    return 1


@functools.cache
def forward_layout(cfg: ModelConfig, ranks: int = 1) -> ForwardLayout:
    """The packed layout for ``cfg`` (``n_features`` resolved); with ``ranks`` > 1 (from
    :func:`cluster_ranks`) the layout of one rank's share, of which the packed buffer holds
    ``ranks`` (:func:`pack_params`): its heads' channels of in_proj (padded to a multiple of
    4 columns), conv, dt, A, D, gated norm and out_proj, its group's B and C, and the whole of
    the embedding, the norms and both heads."""
    param_shapes(cfg)  # raises ModelError while n_features is unresolved
    d, f = cfg.d_model, cfg.n_features
    di, heads, groups = cfg.d_inner // ranks, cfg.n_heads // ranks, 1 if ranks > 1 else cfg.ngroups
    ip = 2 * di + 2 * groups * cfg.d_state + heads
    if ranks > 1:
        ip = _aligned(ip)
    conv = di + 2 * groups * cfg.d_state
    n_q, n_r = cfg.n_actions * cfg.n_atoms, cfg.return_bins
    block = {
        "BLK_NORM": d,
        "BLK_WIN_T": ip * d,
        "BLK_CONV_W": conv * cfg.d_conv,
        "BLK_CONV_B": conv,
        "BLK_DT_BIAS": heads,
        "BLK_A": heads,
        "BLK_D": heads,
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
        "MF_H": heads,
        "MF_P": cfg.headdim,
        "MF_G": groups,
        "MF_N": cfg.d_state,
        "MF_W": cfg.d_conv,
        "MF_NQ": n_q,
        "MF_NR": n_r,
        "MF_A": cfg.n_actions,
        "MF_ATOMS": cfg.n_atoms,
    }
    if ranks > 1:
        dims |= {
            "MF_IP": ip,
            "MF_CL": ranks,
            "MF_GRANKS": ranks // cfg.ngroups,
            "MF_GW": cfg.d_inner // cfg.ngroups,
            "MF_PSTRIDE": pos,
            "MF_DIF": cfg.d_inner,
            "MF_HF": cfg.n_heads,
            "MF_GF": cfg.ngroups,
        }
    options = tuple(f"-D{k}={v}" for k, v in (dims | offsets).items())
    k = cfg.window
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
        + (
            _aligned(k * ranks // cfg.ngroups) + ranks * -(-k // ranks) * d if ranks > 1 else 0
        )  # SM_SS, SM_EX
    )
    return ForwardLayout(offsets, pos, shared, staged, options)


def shared_bytes(cfg: ModelConfig, variant: Variant) -> int:
    """Dynamic shared memory of one block of ``variant``."""
    layout = forward_layout(cfg, cluster_ranks(cfg, variant))
    if variant.staged:
        return 4 * layout.staged_floats
    # MF_LDU: the tensor-core form pads the pre-norm buffer's rows (K, D) to D + 8 floats
    d, k = cfg.d_model, cfg.window
    padded = _aligned(k * (d + 8)) - _aligned(k * d) if variant.tensor and d % 16 == 0 else 0
    return 4 * (layout.shared_floats + padded)


def pack_params(
    params: Mapping[str, npt.ArrayLike],
    cfg: ModelConfig,
    feature_mean: npt.ArrayLike,
    feature_std: npt.ArrayLike,
    ranks: int = 1,
) -> npt.NDArray[np.float32]:
    """The kernel's packed float32 buffer (host) from the model's parameter dict and the
    checkpoint's normalisation statistics (F,) each. Shapes are those of
    :func:`agent.model.params.param_shapes`; the caller validates them first. With ``ranks``
    > 1, the ``ranks`` shares of :func:`forward_layout` one after another."""
    if ranks > 1:
        return np.concatenate(
            [
                _pack(_share(params, cfg, ranks, r), cfg, feature_mean, feature_std, ranks)
                for r in range(ranks)
            ]
        )
    return _pack(params, cfg, feature_mean, feature_std, 1)


def _share(params: Mapping[str, npt.ArrayLike], cfg: ModelConfig, ranks: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s share of the parameters (its heads, their group's B and C; see
    :func:`forward_layout`), named as the model's, with the share's shapes."""
    di, h, n = cfg.d_inner, cfg.n_heads, cfg.d_state
    dr, hr = di // ranks, h // ranks
    g = rank * hr // (h // cfg.ngroups)
    mine = np.arange(rank * dr, (rank + 1) * dr)
    heads = np.arange(rank * hr, (rank + 1) * hr)
    bc = np.concatenate([di + g * n + np.arange(n), di + cfg.ngroups * n + g * n + np.arange(n)])
    rows = np.concatenate([mine, di + mine, di + bc, 2 * di + 2 * cfg.ngroups * n + heads])
    channels = np.concatenate([mine, bc])
    share = dict(params)
    for i in range(cfg.n_layers):
        p = block_prefix(i)
        w_in = np.asarray(params[p + "W_in"], dtype=np.float32)[rows]
        pad = _aligned(w_in.shape[0]) - w_in.shape[0]
        share[p + "W_in"] = np.concatenate([w_in, np.zeros((pad, w_in.shape[1]), np.float32)])
        share[p + "conv_w"] = np.asarray(params[p + "conv_w"])[channels]
        share[p + "conv_b"] = np.asarray(params[p + "conv_b"])[channels]
        for name in ("dt_bias", "A_log", "D"):
            share[p + name] = np.asarray(params[p + name])[heads]
        share[p + "gnorm_w"] = np.asarray(params[p + "gnorm_w"])[mine]
        share[p + "W_out"] = np.asarray(params[p + "W_out"])[:, mine]
    return share


def _pack(
    params: Mapping[str, npt.ArrayLike],
    cfg: ModelConfig,
    feature_mean: npt.ArrayLike,
    feature_std: npt.ArrayLike,
    ranks: int,
) -> npt.NDArray[np.float32]:
    layout = forward_layout(cfg, ranks)
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
    preallocated. A split ``variant`` takes the buffer packed with its :func:`cluster_ranks`.
    The engine runs the same forward inside :func:`agent.kernels.decide.decide`.
    """
    cp = cupy()
    rows = slots.shape[0]
    q_logits = cp.empty((rows, cfg.n_actions * cfg.n_atoms), cp.float32) if q_logits is None else q_logits
    ret_logits = cp.empty((rows, cfg.return_bins), cp.float32) if ret_logits is None else ret_logits
    fn, shared = compiled("mamba_forward.cu", "mamba_forward_kernel", cfg, variant)
    if rows:
        fn(
            (rows * cluster_ranks(cfg, variant),),
            (variant.threads,),
            (packed, window, slots, q_logits, ret_logits),
            shared_mem=shared,
        )
    return q_logits, ret_logits


def compiled(file: str, name: str, cfg: ModelConfig, variant: Variant) -> tuple[Any, int]:
    """Kernel ``name`` of ``file`` (which includes ``mamba_forward.cuh``) compiled for ``cfg``
    and ``variant``, opted in to its dynamic shared memory; and that many bytes."""
    options = (*forward_layout(cfg, cluster_ranks(cfg, variant)).options, *variant.options())
    fn = kernel(file, name, options=options)
    shared = shared_bytes(cfg, variant)
    if (file, options) not in _OPTED_IN:  # above 48 KiB of shared memory a kernel must opt in, once
        fn.max_dynamic_shared_size_bytes = shared
        _OPTED_IN.add((file, options))
    return fn, shared
