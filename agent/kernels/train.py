"""The trainer's kernels (``train.cu``): one learner update with no host synchronisation, and
the acting forward of the rollouts.

An update on a batch of B transitions is one stream of launches, captured once per batch size as
a CUDA graph by :class:`agent.train.cuda_learner.CudaLearner` (:class:`FusedUpdate`): the
network over the batch's B * K rows at once, for the online and target networks on s' and the
online network on s, with the projections and every weight gradient as matrix products
(:class:`agent.kernels.blas.StreamGemm`: the tensor cores' ``gemm.cu`` or cuBLAS) and these
kernels between them:

========================  ==========  ===========================================================
kernel                    grid        what
========================  ==========  ===========================================================
``embed_kernel``          rows / 8    a pass's model input from the fold's features, the embedding,
                                      the first block's pre-norm
``norm_kernel``           rows / 8    a block's pre-norm (or the final norm), the residual sum
``mid_forward_kernel``    B           conv, dt, scan, gated norm of one window
``loss_kernel``           B           the sample's losses and the gradient at the heads' logits
``mid_backward_kernel``   B           their backward, the small parameters' gradients a row a window
``norm_backward_kernel``  rows / 8    the norm's backward, the residual stream's gradient
``sumsq_kernel``          total/256   sums of squares of the gradient per block (float64)
``adam_kernel``           total/256   global norm; when finite: clip, Adam, Polyak or hard sync
``finish_kernel``         1 warp      counters and the update's record in the stats ring
========================  ==========  ===========================================================

Parameters are the packed float32 buffer of :func:`agent.kernels.mamba_forward.pack_params`
(the inference layout, with normalisation statistics 0 and 1: the trainer's windows are
normalised); gradients and Adam's moments share it. References: the model's
:func:`agent.model.network.backward`, :mod:`agent.model.losses` and :mod:`agent.model.optim`,
chained as :meth:`agent.train.learner.Learner.update` chains them (:func:`update_ref`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from agent.kernels.blas import StreamGemm
from agent.kernels.mamba_forward import Variant, forward_layout, pack_params
from agent.model.arrays import Params
from agent.model.config import ModelConfig
from agent.model.heads import c51_support, expected_q, q_probs, return_bin_of
from agent.model.losses import c51_loss_and_grad, c51_project_ref, munchausen_project, return_loss_and_grad
from agent.model.network import backward, forward
from agent.model.optim import Adam, AdamState
from agent.model.params import block_prefix, param_shapes

__all__ = [
    "COUNTERS",
    "INPUTS",
    "STATS_DTYPE",
    "TRAIN",
    "FusedUpdate",
    "TrainLayout",
    "UpdateSettings",
    "input_shape",
    "pack_train",
    "train_layout",
    "unpack_params",
    "update_ref",
]

TRAIN = Variant("train", 512, 4, staged=False, adaptive=True)
"""The trainer's compiled form: 512 threads a block, weights read through the cache, row tiles
that keep every thread busy."""

COUNTERS = ("adam_step", "updates", "skipped", "ring")
"""The device counters (int64), in ``train.cu``'s order (TR_ADAM_STEP ...)."""

STATS_DTYPE = np.dtype(
    [("c51_loss", np.float32), ("ret_loss", np.float32), ("grad_norm", np.float32), ("skipped", np.int32)]
)
"""One update's record in the stats ring (``TrainStats`` in ``train.cu``)."""

_MAX_SHARED = 227 * 1024
"""Dynamic shared memory a Hopper block may opt in to (bytes)."""
_STATIC_SHARED = 256
"""Bytes kept back for the kernels' static ``__shared__`` variables (64 used)."""


def _r4(n: int) -> int:
    return -(-n // 4) * 4


@dataclass(frozen=True, slots=True)
class TrainLayout:
    """Compile options and launch shapes of ``train.cu`` for one model configuration."""

    options: tuple[str, ...]
    """NVRTC (or emulation) ``-D`` options: shapes, packed offsets and the TB_* layout."""
    total: int
    """Floats of the packed parameter buffer."""
    threads: int
    small: int
    """Floats of a block's small parameters (``TB_SMALL``: conv, dt bias, A, D, gnorm weights)."""
    shared: dict[str, int]
    """Dynamic shared memory of each kernel that takes some (bytes)."""
    shared_limit: int
    """Shared memory a block may use (bytes) that the layout was made for."""

    @property
    def fits(self) -> bool:
        """Whether every kernel's working set fits one block's shared memory."""
        return max(self.shared.values()) <= self.shared_limit - _STATIC_SHARED


@functools.cache
def train_layout(cfg: ModelConfig, shared_limit: int = _MAX_SHARED) -> TrainLayout:
    """The layout for ``cfg`` (``n_features`` resolved) in ``shared_limit`` bytes of shared
    memory a block (default: what a Hopper block may opt in to)."""
    fwd = forward_layout(cfg)
    k = cfg.window
    di, h, g, p = cfg.d_inner, cfg.n_heads, cfg.ngroups, cfg.headdim
    cd, ip = cfg.conv_dim, cfg.in_proj_dim
    nq, nr = cfg.n_actions * cfg.n_atoms, cfg.return_bins
    loss = {
        "TB_HEAD": _r4(nq) + _r4(nr),
        "TB_GHEAD": _r4(nq) + _r4(nr),
        "TB_TGT": cfg.n_atoms,
        "TB_SCRATCH": (2 * cfg.n_actions + 1) * cfg.n_atoms,
        "TB_QN": 3 * _r4(nq),
    }
    # The per-window kernels' regions, the forward's first (it allocates up to TB_GO). The
    # backward sees the in_proj output's region as z (TB_Z, (K, Di)) then the other columns
    # (TB_XD); TB_GX shares TB_Y's region (y is dead once the gated norm's backward is done,
    # before the scan's backward first writes gx), and the scan's per-head scratch lives in TB_Z
    # (dead by then too: gz goes straight to global memory) where it fits.
    mid = {
        "TB_ZX": k * ip,
        "TB_XBC": k * cd,
        "TB_DT": k * h,
        "TB_RG": k * g,
        "TB_Y": k * max(cd, di),
        "TB_GO": k * di,
        "TB_GDT": k * h,
        "TB_CB": g * k * k,
        "TB_GCB": g * k * k,
        "TB_CUM": k * h,
        "TB_GCUM": k,
        "TB_GA": h,
    }
    scratch = {
        "TB_M": k * (k + 1),
        "TB_GM": k * (k + 1),
        "TB_GU": k * (p + 1),
        "TB_XH": k * (p + 1),
        "TB_GYH": k * (p + 1),
    }
    # The loss kernel's regions and the per-window kernels' each start at 0: no kernel uses both.
    offsets: dict[str, int] = {}
    ends = []
    for regions in (loss, mid):
        pos = 0
        for name, size in regions.items():
            offsets[name] = pos
            pos += _r4(size)
        ends.append(pos)
    offsets["TB_GX"] = offsets["TB_Y"]
    offsets["TB_Z"] = offsets["TB_ZX"]
    offsets["TB_XD"] = offsets["TB_ZX"] + k * di
    at = offsets["TB_Z"] if sum(_r4(n) for n in scratch.values()) <= k * di else ends[1]
    for name, size in scratch.items():
        offsets[name] = at
        at += _r4(size)
    ends[1] = max(ends[1], at)
    options = (
        *fwd.options,
        *TRAIN.options(),
        f"-DMF_RET_MAX={float(cfg.return_max_ticks)!r}",
        *(f"-D{name}={value}" for name, value in offsets.items()),
    )
    return TrainLayout(
        options=options,
        total=fwd.total,
        threads=TRAIN.threads,
        small=fwd.offsets["BLK_WOUT_T"] - fwd.offsets["BLK_CONV_W"],
        shared={
            "act_kernel": 4 * fwd.shared_floats,
            "loss_kernel": 4 * ends[0],
            "mid_forward_kernel": 4 * offsets["TB_GO"],
            "mid_backward_kernel": 4 * ends[1],
        },
        shared_limit=shared_limit,
    )


def pack_train(params: Mapping[str, npt.ArrayLike], cfg: ModelConfig) -> npt.NDArray[np.float32]:
    """The packed buffer of ``params`` for training (normalisation statistics 0 and 1)."""
    f = cfg.n_features
    return pack_params(params, cfg, np.zeros(f, np.float32), np.ones(f, np.float32))


def unpack_params(packed: npt.ArrayLike, cfg: ModelConfig) -> Params:
    """The parameter dict (host float32 arrays, the shapes of
    :func:`agent.model.params.param_shapes`) held in a packed buffer."""
    flat = np.asarray(packed, dtype=np.float32)
    off = forward_layout(cfg).offsets
    shapes = param_shapes(cfg)
    out: Params = {}

    def take(name: str, at: int, transposed: bool = False) -> None:
        shape = shapes[name]
        size = int(np.prod(shape))
        if transposed:
            out[name] = flat[at : at + size].reshape(shape[::-1]).T.copy()
        else:
            out[name] = flat[at : at + size].reshape(shape).copy()

    take("embed.W", off["OFF_EMB_WT"], transposed=True)
    take("embed.b", off["OFF_EMB_B"])
    for i in range(cfg.n_layers):
        p = block_prefix(i)
        base = off["OFF_BLOCKS"] + i * off["BLK_STRIDE"]
        take(p + "norm_w", base + off["BLK_NORM"])
        take(p + "W_in", base + off["BLK_WIN_T"], transposed=True)
        take(p + "conv_w", base + off["BLK_CONV_W"])
        take(p + "conv_b", base + off["BLK_CONV_B"])
        take(p + "dt_bias", base + off["BLK_DT_BIAS"])
        take(p + "A_log", base + off["BLK_A"])
        take(p + "D", base + off["BLK_D"])
        take(p + "gnorm_w", base + off["BLK_GNORM"])
        take(p + "W_out", base + off["BLK_WOUT_T"], transposed=True)
    take("final_norm_w", off["OFF_FINAL_NORM"])
    take("q.W", off["OFF_Q_WT"], transposed=True)
    take("q.b", off["OFF_Q_B"])
    take("ret.W", off["OFF_R_WT"], transposed=True)
    take("ret.b", off["OFF_R_B"])
    return out


class MatMul(Protocol):
    """``mm(a, b, out, accumulate=False)``: ``out = a @ b`` (``+=`` when ``accumulate``) into
    the preallocated ``out``."""

    def __call__(self, a: Any, b: Any, out: Any, accumulate: bool = False) -> None: ...


KernelGetter = Callable[[str], Any]
"""``name -> kernel`` callable like ``cupy.RawKernel`` (``fn(grid, block, args, shared_mem=)``)."""


@dataclass(frozen=True, slots=True)
class UpdateSettings:
    """The learner's hyper-parameters as the kernels take them."""

    lr: float
    eps: float
    max_norm: float
    """Global-norm clip."""
    target_mode: int
    """0: the online network is its own target; 1: Polyak; 2: hard copy every ``hard_every``."""
    rho: float
    hard_every: int
    ret_weight: float
    """Weight of the return head's loss."""
    munchausen: bool = False
    """Munchausen C51 targets (the pi(.|s')-mixture with the bonus) instead of double DQN."""
    m_alpha: float = 0.9
    m_tau: float = 0.03
    m_clip: float = -1.0
    beta1: float = 0.9
    beta2: float = 0.999


INPUTS: dict[str, tuple[tuple[str, ...], Any]] = {
    "t_obs": (("B",), np.int64),
    "agent_obs": (("B", "K", "AG"), np.float32),
    "t_next": (("B",), np.int64),
    "agent_next": (("B", "K", "AG"), np.float32),
    "action": (("B",), np.int32),
    "reward": (("B",), np.float32),
    "discount": (("B",), np.float32),
    "label": (("B",), np.float64),
}
"""A batch's inputs (host-written; the kernels read them where they lie): name -> (shape, dtype)."""


def input_shape(name: str, batch: int, cfg: ModelConfig, n_agent: int = 2) -> tuple[int, ...]:
    dims = {"B": batch, "K": cfg.window, "AG": n_agent}
    return tuple(dims[d] for d in INPUTS[name][0])


class FusedUpdate:
    """Device state of the learner and the launches of one update (any array module with a
    kernel getter: CuPy, the stream products and NVRTC in production, NumPy and the CPU emulation
    in the tests).

    Buffers (``xp`` arrays): ``params``, ``target`` (the packed online and target networks;
    ``target`` is ``params`` itself when ``target_mode`` is 0), ``m``, ``v``, ``grad`` (the
    batch's gradient, assembled in the packed layout), ``sumsq``, ``norm``, ``counters`` (int64,
    :data:`COUNTERS`), ``ring`` (``ring_size`` records of :data:`STATS_DTYPE` as bytes),
    ``sample_stats`` (B, 3), and the activations of the batch (below). ``feat`` is the fold's
    normalised market features (rows, F - 2) on the device; ``inputs`` the batch
    (:data:`INPUTS`). ``layout``: the one the kernels were compiled with (default
    ``train_layout(cfg)``).

    The network runs over the batch's B * K rows at once: the projections and the weight gradients
    are matrix products (into preallocated outputs; on the device
    :class:`~agent.kernels.blas.StreamGemm`, deterministic), the norms row kernels, and what runs
    along a window's steps a kernel with a block a window (``mid_forward_kernel``,
    ``mid_backward_kernel``). Sums over rows (biases, norm weights, the small parameters'
    per-window gradients) are products with a row of ones. Every entry of the gradient is written
    once an update; its padding is never written (zero).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        settings: UpdateSettings,
        *,
        xp: Any,
        get: KernelGetter,
        packed: npt.NDArray[np.float32],
        inputs: Mapping[str, Any],
        ring_size: int,
        layout: TrainLayout | None = None,
    ) -> None:
        layout = layout or train_layout(cfg)
        self.cfg, self.settings, self.layout, self.xp, self._get = cfg, settings, layout, xp, get
        for name, nbytes in layout.shared.items():
            get(name).max_dynamic_shared_size_bytes = nbytes
        self.batch = int(inputs["t_obs"].shape[0])
        self.inputs = dict(inputs)
        total, batch = layout.total, self.batch
        self.params = xp.asarray(packed, dtype=np.float32).copy()
        self.target = self.params if settings.target_mode == 0 else self.params.copy()
        self.m = xp.zeros(total, dtype=np.float32)
        self.v = xp.zeros(total, dtype=np.float32)
        self.grad = xp.zeros(total, dtype=np.float32)
        self.n_sums = -(-total // 256)
        self.sumsq = xp.zeros(self.n_sums, dtype=np.float64)
        self.norm = xp.zeros(1, dtype=np.float32)
        self.counters = xp.zeros(len(COUNTERS), dtype=np.int64)
        self.ring_size = ring_size
        self.ring = xp.zeros((ring_size, STATS_DTYPE.itemsize), dtype=np.uint8)
        self.sample_stats = xp.zeros((batch, 3), dtype=np.float32)
        self.support = xp.linspace(cfg.v_min, cfg.v_max, cfg.n_atoms, dtype=np.float32)
        self.feat: Any = xp.zeros((1, cfg.n_features - 2), dtype=np.float32)
        sides = 3 if settings.munchausen else 2
        self._acts = _Activations(cfg, batch, layout.small, sides, xp)
        self._mm = _matmul(xp)
        self._lanes = _Lanes(xp, sides)

    def reset_optimizer(self) -> None:
        """Fresh Adam moments and step count; the target synced to the online network."""
        self.m[...] = 0.0
        self.v[...] = 0.0
        self.counters[0] = 0
        if self.target is not self.params:
            self.target[...] = self.params

    # views of the packed buffers ------------------------------------------------------------

    def _mat(self, buf: Any, name: str, rows: int, cols: int, layer: int | None = None) -> Any:
        """The (rows, cols) matrix at offset ``name`` (of block ``layer`` for a ``BLK_*`` name)
        of a packed buffer, as a view."""
        off = forward_layout(self.cfg).offsets
        at = off[name] + (0 if layer is None else off["OFF_BLOCKS"] + layer * off["BLK_STRIDE"])
        return buf[at : at + rows * cols].reshape(rows, cols)

    def _vec(self, buf: Any, name: str, n: int, layer: int | None = None) -> Any:
        """The (1, n) row at offset ``name`` of a packed buffer (a view)."""
        return self._mat(buf, name, 1, n, layer)

    # the network over the batch ---------------------------------------------------------------

    def _rows(self, fn: str, rows: int, args: tuple[Any, ...], per_warp: int = 1) -> None:
        warps = _ROW_THREADS // 32
        self._get(fn)((-(-rows // (warps * per_warp)),), (_ROW_THREADS,), args)

    def _norm(
        self,
        a: Any,
        w: Any,
        out: tuple[Any, Any],
        rows: int,
        *,
        every: int = 1,
        first: int = 0,
        add: Any | None = None,
        h: Any | None = None,
    ) -> None:
        """``norm_kernel`` on ``rows`` rows: x = a[i * every + first] (+ add[i]), kept in ``h``
        when given; ``out`` = (u, r)."""
        dummy = self._acts.dummy
        self._rows(
            "norm_kernel",
            rows,
            (
                a,
                np.int32(every),
                np.int32(first),
                dummy if add is None else add,
                np.int32(add is not None),
                dummy if h is None else h,
                np.int32(h is not None),
                w,
                *out,
                np.int32(rows),
            ),
        )

    def _forward(
        self,
        P: Any,
        t: Any,
        agent: Any,
        q_out: Any,
        r_out: Any | None,
        *,
        acts: _Pass,
        mm: MatMul,
    ) -> None:
        """The network ``P`` on the windows of decision bars ``t`` (B,) with the agent columns
        ``agent`` (B, K, 2) into the pass buffers ``acts``, with products ``mm``: the heads'
        logits without their biases into ``q_out`` (and ``r_out``); ``acts`` keeps the model
        input, y and rg when it is the pass the backward reads."""
        cfg, save = self.cfg, acts is self._acts.main
        k, d, di, ip = cfg.window, cfg.d_model, cfg.d_inner, cfg.in_proj_dim
        b, rows = self.batch, self.batch * cfg.window
        self._rows(
            "embed_kernel",
            rows,
            (
                P,
                self.feat,
                t,
                agent,
                self._acts.x_obs if save else self._acts.dummy,
                np.int32(save),
                acts.h[0],
                acts.u[0],
                acts.r[0],
                np.int32(rows),
            ),
            per_warp=_EMBED_ROWS,
        )
        for layer in range(cfg.n_layers):
            last = layer == cfg.n_layers - 1
            t0 = k - 1 if last else 0
            w_in, zx = self._mat(P, "BLK_WIN_T", d, ip, layer), acts.zx[layer]
            if last:  # x, B, C, dt at every step; z (the gate) at the last step only
                mm(acts.u[layer], w_in[:, di:], zx[:, di:])
                mm(acts.u[layer][k - 1 :: k], w_in[:, :di], zx[k - 1 :: k, :di])
            else:
                mm(acts.u[layer], w_in, zx)
            self._get("mid_forward_kernel")(
                (b,),
                (self.layout.threads,),
                (
                    P,
                    np.int32(layer),
                    acts.zx[layer],
                    acts.o[layer],
                    np.int32(t0),
                    np.int32(save),
                    acts.y[layer],
                    acts.rg[layer],
                ),
                shared_mem=self.layout.shared["mid_forward_kernel"],
            )
            out_rows = acts.o[layer].shape[0]
            mm(acts.o[layer], self._mat(P, "BLK_WOUT_T", di, d, layer), acts.tmp[:out_rows])
            if last:
                self._norm(
                    acts.h[layer],
                    self._vec(P, "OFF_FINAL_NORM", d),
                    (acts.feat, acts.rf),
                    b,
                    every=k,
                    first=k - 1,
                    add=acts.tmp[:b],
                    h=acts.hf,
                )
            else:
                self._norm(
                    acts.h[layer],
                    self._vec(P, "BLK_NORM", d, layer + 1),
                    (acts.u[layer + 1], acts.r[layer + 1]),
                    rows,
                    add=acts.tmp,
                    h=acts.h[layer + 1],
                )
        nq, nr = cfg.n_actions * cfg.n_atoms, cfg.return_bins
        mm(acts.feat, self._mat(P, "OFF_Q_WT", d, nq), q_out)
        if r_out is not None:
            mm(acts.feat, self._mat(P, "OFF_R_WT", d, nr), r_out)

    def _backward(self) -> None:
        """The gradient of the loss (``gq``, ``gr`` at the heads' logits, the activations of the
        last saving forward) into ``grad``."""
        cfg, acts, mm, P, G = self.cfg, self._acts, self._mm, self.params, self.grad
        fp = acts.main
        k, d, di, ip, f = cfg.window, cfg.d_model, cfg.d_inner, cfg.in_proj_dim, cfg.n_features
        nq, nr = cfg.n_actions * cfg.n_atoms, cfg.return_bins
        b, rows = self.batch, self.batch * cfg.window
        ones_b, ones = acts.ones_b, acts.ones
        weights = self._lanes.side[0]
        # Heads and the final norm.
        mm(fp.feat.T, acts.gq, self._mat(G, "OFF_Q_WT", d, nq))
        mm(ones_b, acts.gq, self._vec(G, "OFF_Q_B", nq))
        mm(fp.feat.T, acts.gr, self._mat(G, "OFF_R_WT", d, nr))
        mm(ones_b, acts.gr, self._vec(G, "OFF_R_B", nr))
        mm(acts.gq, self._mat(P, "OFF_Q_WT", d, nq).T, acts.gfeat_q)
        mm(acts.gr, self._mat(P, "OFF_R_WT", d, nr).T, acts.gfeat_r)
        self._rows(
            "norm_backward_kernel",
            b,
            (
                fp.hf,
                fp.rf,
                acts.gfeat_q,
                acts.gfeat_r,
                np.int32(1),
                self._vec(P, "OFF_FINAL_NORM", d),
                acts.dummy,
                np.int32(0),
                acts.ghf,
                acts.gnw,
                np.int32(b),
            ),
        )
        mm(ones_b, acts.gnw[:b], self._vec(G, "OFF_FINAL_NORM", d))
        for layer in reversed(range(cfg.n_layers)):
            last = layer == cfg.n_layers - 1
            t0 = k - 1 if last else 0
            gout = acts.ghf if last else acts.gh
            go = acts.go[: gout.shape[0]]
            mm(fp.o[layer].T, gout, self._mat(G, "BLK_WOUT_T", di, d, layer))
            mm(gout, self._mat(P, "BLK_WOUT_T", di, d, layer).T, go)
            u, gzx, gsmall = fp.u[layer], acts.gzx[layer], acts.gsmall[layer]
            self._get("mid_backward_kernel")(
                (b,),
                (self.layout.threads,),
                (P, np.int32(layer), fp.zx[layer], fp.y[layer], fp.rg[layer], go, np.int32(t0), gzx, gsmall),
                shared_mem=self.layout.shared["mid_backward_kernel"],
            )
            w_in, g_in = self._mat(P, "BLK_WIN_T", d, ip, layer), self._mat(G, "BLK_WIN_T", d, ip, layer)
            # The block's in_proj and small-parameter gradients on the weights lane, beside the
            # rest of the backward (they read the block's own gzx and gsmall, nothing later writes).
            self._lanes.hand(weights)
            with weights:
                wm = weights.mm
                wm(ones_b, gsmall, self._vec(G, "BLK_CONV_W", self.layout.small, layer))
                if last:  # gz lives at the last step only (the kernel writes no other row of it)
                    wm(u.T, gzx[:, di:], g_in[:, di:])
                    wm(u[k - 1 :: k].T, gzx[k - 1 :: k, :di], g_in[:, :di])
                else:
                    wm(u.T, gzx, g_in)
            if last:
                mm(gzx[:, di:], w_in[:, di:].T, acts.gu)
                mm(gzx[k - 1 :: k, :di], w_in[:, :di].T, acts.gu[k - 1 :: k], accumulate=True)
            else:
                mm(gzx, w_in.T, acts.gu)
            self._rows(
                "norm_backward_kernel",
                rows,
                (
                    fp.h[layer],
                    fp.r[layer],
                    acts.gu,
                    acts.dummy,
                    np.int32(0),
                    self._vec(P, "BLK_NORM", d, layer),
                    gout,
                    np.int32(2 if last else 1),
                    acts.gh,
                    acts.gnw,
                    np.int32(rows),
                ),
            )
            mm(ones, acts.gnw, self._vec(G, "BLK_NORM", d, layer))
        mm(acts.x_obs.T, acts.gh, self._mat(G, "OFF_EMB_WT", f, d))
        mm(ones, acts.gh, self._vec(G, "OFF_EMB_B", d))
        self._lanes.join()

    def enqueue(self) -> None:
        """Launch one update on the current stream (the batch already in ``inputs``)."""
        lay, b, s, acts = self.layout, self.batch, self.settings, self._acts
        i = self.inputs
        # The next-state passes (online and target networks on s', and the target on s with
        # Munchausen) beside the forward on s.
        s_next, s_now = (i["t_next"], i["agent_next"]), (i["t_obs"], i["agent_obs"])
        side = [(self.params, s_next, acts.qn_online), (self.target, s_next, acts.qn_target)]
        if s.munchausen:
            side.append((self.target, s_now, acts.qt_now))
        self._lanes.fork()
        for lane, scratch, (P, state, out) in zip(self._lanes.side, acts.side, side, strict=True):
            with lane:
                self._forward(P, *state, out, None, acts=scratch, mm=lane.mm)
        self._forward(self.params, *s_now, acts.q_s, acts.r_s, acts=acts.main, mm=self._mm)
        self._lanes.join()
        self._get("loss_kernel")(
            (b,),
            (lay.threads,),
            (
                self.params,
                self.target,
                self.support,
                acts.q_s,
                acts.r_s,
                acts.qn_online,
                acts.qn_target,
                acts.qt_now,
                i["action"],
                i["reward"],
                i["discount"],
                i["label"],
                np.int32(s.munchausen),
                np.float32(s.m_alpha),
                np.float32(s.m_tau),
                np.float32(s.m_clip),
                np.float32(s.ret_weight),
                np.int32(b),
                acts.gq,
                acts.gr,
                self.sample_stats,
            ),
            shared_mem=lay.shared["loss_kernel"],
        )
        self._backward()
        self._get("sumsq_kernel")((self.n_sums,), (256,), (self.grad, np.int32(lay.total), self.sumsq))
        self._get("adam_kernel")(
            (self.n_sums,),
            (256,),
            (
                self.params,
                self.target,
                self.m,
                self.v,
                self.grad,
                self.sumsq,
                np.int32(self.n_sums),
                np.int32(lay.total),
                self.counters,
                np.float32(s.lr),
                np.float32(s.beta1),
                np.float32(s.beta2),
                np.float32(s.eps),
                np.float32(s.max_norm),
                np.int32(s.target_mode),
                np.float32(s.rho),
                np.int32(s.hard_every),
                self.norm,
            ),
        )
        self._get("finish_kernel")(
            (1,),
            (32,),
            (self.sample_stats, np.int32(b), self.norm, self.counters, self.ring, np.int32(self.ring_size)),
        )

    def act(
        self, t: Any, agent: Any, step: Any, *, seed: int, purpose: int, greedy: bool, action: Any, q: Any
    ) -> None:
        """Launch the acting forward for E = len(t) windows (outputs ``action`` (E,) int32 and
        ``q`` (E, A) float32, any memory the kernel can write)."""
        lay = self.layout
        rows = int(t.shape[0])
        if rows:
            self._get("act_kernel")(
                (rows,),
                (lay.threads,),
                (
                    self.params,
                    self.support,
                    self.feat,
                    t,
                    agent,
                    step,
                    np.uint64(seed),
                    np.uint32(purpose),
                    np.int32(int(greedy)),
                    action,
                    q,
                ),
                shared_mem=lay.shared["act_kernel"],
            )


_ROW_THREADS = 256
"""Threads a block of the row kernels (``TR_ROW_THREADS``: a warp a row)."""
_EMBED_ROWS = 4
"""Rows a warp of ``embed_kernel`` (``TR_EMBED_ROWS``)."""


def _matmul(xp: Any) -> MatMul:
    """The products of an update (operands and ``out`` views with a unit stride: blocks of
    columns, every K-th row and transposes are read and written as they lie). On the device one
    product on the stream current now (``gemm.cu`` or cuBLAS sgemm), with no allocation and valid
    inside a capture (:class:`agent.kernels.blas.StreamGemm`)."""
    if xp is np:

        def host(a: Any, b: Any, out: Any, accumulate: bool = False) -> None:
            if accumulate:
                out += a @ b
            else:
                np.matmul(a, b, out=out)

        return host
    return StreamGemm()


class _Pass:
    """One forward pass's activations (B windows of K rows; the last block keeps only its last
    step past the middle). ``y`` and ``rg`` are kept by the pass the backward reads (``save``)."""

    def __init__(self, cfg: ModelConfig, batch: int, xp: Any, *, save: bool) -> None:
        k, d, di, ip = cfg.window, cfg.d_model, cfg.d_inner, cfg.in_proj_dim
        rows = batch * k

        def z(*shape: int) -> Any:
            return xp.zeros(shape, dtype=np.float32)

        self.tmp = z(rows, d)
        """out_proj's output before it joins the residual stream."""
        layers = range(cfg.n_layers)
        self.h = [z(rows, d) for _ in layers]
        """Each block's input (the residual stream)."""
        self.u = [z(rows, d) for _ in layers]
        self.r = [z(rows) for _ in layers]
        self.zx = [z(rows, ip) for _ in layers]
        kept = [rows if i < cfg.n_layers - 1 else batch for i in layers]
        self.o = [z(n, di) for n in kept]
        self.y = [z(n if save else 1, di) for n in kept]
        self.rg = [z(n if save else 1, cfg.ngroups) for n in kept]
        self.hf, self.feat, self.rf = z(batch, d), z(batch, d), z(batch)


class _Activations:
    """The batch's activations an update writes and reads: the forward on s (``main``, kept for
    the backward), the next-state passes' (``side``, one each: they run concurrently), the
    heads' outputs and the backward's gradients."""

    def __init__(self, cfg: ModelConfig, batch: int, small: int, sides: int, xp: Any) -> None:
        k, d, di, ip, f = cfg.window, cfg.d_model, cfg.d_inner, cfg.in_proj_dim, cfg.n_features
        nq, nr = cfg.n_actions * cfg.n_atoms, cfg.return_bins
        rows = batch * k

        def z(*shape: int) -> Any:
            return xp.zeros(shape, dtype=np.float32)

        self.dummy = z(4)
        self.ones = xp.ones((1, rows), dtype=np.float32)
        self.ones_b = xp.ones((1, batch), dtype=np.float32)
        self.x_obs = z(rows, f)
        """The model input of the windows of s (the embedding's gradient reads it)."""
        self.main = _Pass(cfg, batch, xp, save=True)
        self.side = [_Pass(cfg, batch, xp, save=False) for _ in range(sides)]
        self.q_s, self.r_s = z(batch, nq), z(batch, nr)
        self.qn_online, self.qn_target, self.qt_now = z(batch, nq), z(batch, nq), z(batch, nq)
        self.gq, self.gr = z(batch, nq), z(batch, nr)
        self.gfeat_q, self.gfeat_r, self.ghf = z(batch, d), z(batch, d), z(batch, d)
        self.gh, self.gu, self.gnw = z(rows, d), z(rows, d), z(rows, d)
        self.go = z(rows, di)
        self.gzx = [z(rows, ip) for _ in range(cfg.n_layers)]
        """A block's gradient at its in_proj output, one buffer a block (its weight gradient
        runs beside the next block's backward)."""
        self.gsmall = [z(batch, small) for _ in range(cfg.n_layers)]


class _Lane:
    """A stream beside the update's own, with its products (device); on the host, in order."""

    def __init__(self, stream: Any, mm: MatMul) -> None:
        self.stream, self.mm = stream, mm

    def __enter__(self) -> None:
        if self.stream is not None:
            self.stream.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)


class _Lanes:
    """Streams beside the update's own: on the device a stream each, forked from the stream
    current at construction at the start of an update and joined back before the loss, so that
    the next-state passes run beside each other and beside the forward on s; in the backward the
    first lane takes each block's weight gradients as soon as the block's gzx is written
    (:meth:`hand`) and joins back before the norm of the gradient. A captured graph keeps the
    forks and joins as edges; on the host everything runs in order."""

    def __init__(self, xp: Any, n: int) -> None:
        if xp is np:
            self.side = [_Lane(None, _matmul(xp)) for _ in range(n)]
            self._main = None
            return
        streams = [xp.cuda.Stream(non_blocking=True) for _ in range(n)]
        self.side = [_Lane(stream, StreamGemm(stream)) for stream in streams]
        self._main = xp.cuda.get_current_stream()
        self._forked = xp.cuda.Event(disable_timing=True)
        self._handed = xp.cuda.Event(disable_timing=True)
        self._done = [xp.cuda.Event(disable_timing=True) for _ in range(n)]

    def fork(self) -> None:
        if self._main is None:
            return
        self._forked.record(self._main)
        for lane in self.side:
            lane.stream.wait_event(self._forked)

    def hand(self, lane: _Lane) -> None:
        """Let ``lane`` go on from what the stream current at construction has enqueued so far
        (on the host: nothing to do)."""
        if self._main is None:
            return
        self._handed.record(self._main)
        lane.stream.wait_event(self._handed)

    def join(self) -> None:
        if self._main is None:
            return
        for lane, done in zip(self.side, self._done, strict=True):
            done.record(lane.stream)
            self._main.wait_event(done)


def update_ref(
    params: Mapping[str, npt.ArrayLike],
    target: Mapping[str, npt.ArrayLike] | None,
    cfg: ModelConfig,
    *,
    settings: UpdateSettings,
    feat: npt.ArrayLike,
    inputs: Mapping[str, npt.ArrayLike],
    adam: AdamState | None = None,
    updates: int = 0,
) -> tuple[Params, Params | None, AdamState, Params, dict[str, float]]:
    """Reference of one update, float64 (the chain of :meth:`agent.train.learner.Learner.update`).

    ``params``/``target`` dicts (``target`` None: the online network is its own target),
    ``feat`` (rows, F - 2) normalised market features, ``inputs`` as :data:`INPUTS` (host);
    ``adam``: the optimiser's state to continue (None: fresh), ``updates``: updates applied
    before (the hard sync's clock). Returns the new parameters, the new target, Adam's state, the
    batch gradient (before clipping) and the stats (``c51_loss``, ``ret_loss``, ``grad_norm``,
    ``skipped``).
    """
    p64 = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    t64 = p64 if target is None else {k: np.asarray(v, dtype=np.float64) for k, v in target.items()}
    rows = np.asarray(feat, dtype=np.float64)

    def windows(t: npt.ArrayLike, agent: npt.ArrayLike) -> npt.NDArray[np.float64]:
        idx = np.asarray(t)[:, None] + np.arange(1 - cfg.window, 1)[None, :]
        return np.concatenate([rows[idx], np.asarray(agent, dtype=np.float64)], axis=2)

    obs, nxt = windows(inputs["t_obs"], inputs["agent_obs"]), windows(inputs["t_next"], inputs["agent_next"])
    batch = obs.shape[0]
    support = c51_support(cfg, np, np.float64)
    q_logits, ret_logits, cache = forward(p64, cfg, obs)
    online_next = q_probs(forward(p64, cfg, nxt)[0])
    target_next = online_next if target is None else q_probs(forward(t64, cfg, nxt)[0])
    reward = np.asarray(inputs["reward"], dtype=np.float64)
    discount = np.asarray(inputs["discount"], dtype=np.float64)
    if settings.munchausen:
        target_now = q_probs(forward(t64, cfg, obs)[0])
        m = munchausen_project(
            target_next,
            expected_q(target_next, support),
            expected_q(target_now, support),
            actions=np.asarray(inputs["action"], dtype=np.int64),
            rewards=reward,
            discounts=discount,
            support=support,
            alpha=settings.m_alpha,
            tau=settings.m_tau,
            clip_low=settings.m_clip,
        )
    else:
        a_star = np.argmax(expected_q(online_next, support), axis=1)
        m = c51_project_ref(target_next[np.arange(batch), a_star], reward, discount, support)
    c51_loss, g_q = c51_loss_and_grad(q_logits, np.asarray(inputs["action"], dtype=np.int64), m)
    label = np.asarray(inputs["label"], dtype=np.float64)
    valid = np.isfinite(label) & (settings.ret_weight > 0)
    g_ret = np.zeros_like(ret_logits)
    ret_loss = 0.0
    if valid.any():
        loss_r, g_r = return_loss_and_grad(ret_logits[valid], return_bin_of(label[valid], cfg))
        g_ret[valid] = g_r * (settings.ret_weight * valid.sum() / batch)
        ret_loss = float(loss_r)
    grads, _ = backward(p64, cfg, cache, g_q, g_ret)
    norm = float(np.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))
    stats = {"c51_loss": float(c51_loss), "ret_loss": ret_loss, "grad_norm": norm, "skipped": 0.0}
    new = {k: np.array(v, dtype=np.float64) for k, v in p64.items()}
    new_target = None if target is None else {k: np.array(v) for k, v in t64.items()}
    opt = Adam(new, lr=settings.lr, betas=(settings.beta1, settings.beta2), eps=settings.eps)
    if adam is not None:
        opt = Adam.from_state(adam, new)
    if not np.isfinite(norm):
        stats["skipped"] = 1.0
        return new, new_target, opt.state(), grads, stats
    scale = settings.max_norm / (norm + 1e-6) if norm > settings.max_norm else 1.0
    opt.update(new, {k: g * scale for k, g in grads.items()})
    if new_target is not None and settings.target_mode == 1:
        new_target = {k: v * (1.0 - settings.rho) + settings.rho * new[k] for k, v in new_target.items()}
    elif new_target is not None and settings.target_mode == 2 and (updates + 1) % settings.hard_every == 0:
        new_target = {k: v.copy() for k, v in new.items()}
    return new, new_target, opt.state(), grads, stats
