"""The trainer's kernels (``train.cu``): one learner update with no host synchronisation, and
the acting forward of the rollouts.

An update on a batch of B transitions is five launches in stream order, captured once per
batch size as a CUDA graph by :class:`agent.train.cuda_learner.CudaLearner`:

=====================  ==========  ==============================================================
kernel                 grid        what
=====================  ==========  ==============================================================
``next_logits_kernel``  (B, 2)      online and target network on s' (C51 logits)
``backward_kernel``    B           forward on s, the sample's loss and gradient at both heads,
                                   the backward pass (activations recomputed layer by layer)
                                   -> the sample's row of the partial gradients
``reduce_kernel``      total/256   the batch's gradient (fixed summation order) and sums of
                                   squares per block (float64)
``adam_kernel``        total/256   global norm; when finite: clip, Adam, Polyak or hard sync
``finish_kernel``      1 warp      counters and the update's record in the stats ring
=====================  ==========  ==============================================================

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
from typing import Any

import numpy as np
import numpy.typing as npt

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
    forward_shared: int
    """Dynamic shared memory of ``next_logits_kernel`` and ``act_kernel`` (bytes)."""
    backward_shared: int
    """Dynamic shared memory of ``backward_kernel`` (bytes)."""
    state_floats: int
    """Floats of one layer's forward state (TB_U .. TB_GH) that the backward keeps per sample."""
    shared_limit: int
    """Shared memory a block may use (bytes) that the layout was made for."""

    @property
    def fits(self) -> bool:
        """Whether the backward kernel's working set fits one block's shared memory."""
        return self.backward_shared <= self.shared_limit - _STATIC_SHARED


@functools.cache
def train_layout(cfg: ModelConfig, shared_limit: int = _MAX_SHARED) -> TrainLayout:
    """The layout for ``cfg`` (``n_features`` resolved) in ``shared_limit`` bytes of shared
    memory a block (default: what a Hopper block may opt in to); the projections' weights are
    staged in as many rows a chunk as the limit leaves room for."""
    fwd = forward_layout(cfg)
    k, f, d, layers = cfg.window, cfg.n_features, cfg.d_model, cfg.n_layers
    di, h, g, p = cfg.d_inner, cfg.n_heads, cfg.ngroups, cfg.headdim
    cd, ip = cfg.conv_dim, cfg.in_proj_dim
    nq, nr = cfg.n_actions * cfg.n_atoms, cfg.return_bins
    sizes = {
        "TB_X": k * f,
        "TB_HS": layers * k * d,
        "TB_HF": d,
        "TB_U": k * d,
        "TB_R": k,
        "TB_ZX": k * ip,
        "TB_XBC": k * cd,
        "TB_DT": k * h,
        "TB_Y": k * di,
        "TB_RG": k * g,
        "TB_GH": k * d,
        "TB_GO": k * di,
        "TB_GX": k * max(cd, di),
        "TB_GDT": k * h,
        "TB_M": k * (k + 1),
        "TB_GM": k * (k + 1),
        "TB_GU": k * (p + 1),
        "TB_XH": k * (p + 1),
        "TB_GYH": k * (p + 1),
        "TB_CB": g * k * k,
        "TB_GCB": g * k * k,
        "TB_CUM": k * h,
        "TB_GCUM": k,
        "TB_GA": h,
        "TB_HEAD": _r4(nq) + _r4(nr),
        "TB_GHEAD": _r4(nq) + _r4(nr),
        "TB_FEAT": 4 * _r4(d),
        "TB_TGT": cfg.n_atoms,
        "TB_SCRATCH": (2 * cfg.n_actions + 1) * cfg.n_atoms,
    }
    offsets: dict[str, int] = {}
    pos = 0
    for name, size in sizes.items():
        offsets[name] = pos
        pos += _r4(size)
    # The projections' weights are staged in chunks of whole rows (a multiple of 4, so that every
    # chunk starts 16-byte aligned): as large a region as the rest leaves, from 4 rows of the
    # widest matrix (else the kernel does not fit) up to both matrices whole.
    room = (shared_limit - _STATIC_SHARED) // 4 - pos
    need = max(d * ip, di * d)
    ws = max(min(need, room), 4 * max(ip, d))
    offsets["TB_WS"] = pos
    pos += _r4(ws)
    chunks = {"TB_CH_WIN": min(d, ws // ip // 4 * 4), "TB_CH_WOUT": min(di, ws // d // 4 * 4)}
    options = (
        *fwd.options,
        *TRAIN.options(),
        f"-DMF_RET_MAX={float(cfg.return_max_ticks)!r}",
        *(f"-D{name}={value}" for name, value in offsets.items()),
        *(f"-D{name}={value}" for name, value in chunks.items()),
    )
    return TrainLayout(
        options=options,
        total=fwd.total,
        threads=TRAIN.threads,
        forward_shared=4 * fwd.shared_floats,
        backward_shared=4 * pos,
        state_floats=offsets["TB_GH"] - offsets["TB_U"],
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
    """Device state of the fused learner and the launches of one update (any array module with
    a kernel getter: CuPy and NVRTC in production, NumPy and the CPU emulation in the tests).

    Buffers (``xp`` arrays): ``params``, ``target`` (the packed online and target networks;
    ``target`` is ``params`` itself when ``target_mode`` is 0), ``m``, ``v``, ``grad``,
    ``partial`` (``blocks`` rows of ``total``: one a block of the backward kernel, which takes
    one multiprocessor each and several samples; default one a sample), ``saved`` (each
    sample's layer states), ``sumsq``, ``norm``, ``counters`` (int64, :data:`COUNTERS`),
    ``ring`` (``ring_size`` records of :data:`STATS_DTYPE` as bytes), ``sample_stats`` (B, 3),
    ``q_online``/``q_target`` (B, A * atoms). ``feat`` is the fold's normalised market
    features (rows, F - 2) on the device; ``inputs`` the batch (:data:`INPUTS`). ``layout``:
    the one the kernels were compiled with (default ``train_layout(cfg)``).
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
        blocks: int | None = None,
        layout: TrainLayout | None = None,
    ) -> None:
        layout = layout or train_layout(cfg)
        self.cfg, self.settings, self.layout, self.xp, self._get = cfg, settings, layout, xp, get
        self.batch = int(inputs["t_obs"].shape[0])
        self.inputs = dict(inputs)
        total, batch = layout.total, self.batch
        self.params = xp.asarray(packed, dtype=np.float32).copy()
        self.target = self.params if settings.target_mode == 0 else self.params.copy()
        self.m = xp.zeros(total, dtype=np.float32)
        self.v = xp.zeros(total, dtype=np.float32)
        self.grad = xp.zeros(total, dtype=np.float32)
        self.blocks = min(batch, blocks or batch)
        """Blocks of the backward kernel (one a multiprocessor), each summing its samples."""
        self.partial = xp.zeros((self.blocks, total), dtype=np.float32)
        self.n_sums = -(-total // 256)
        self.sumsq = xp.zeros(self.n_sums, dtype=np.float64)
        self.norm = xp.zeros(1, dtype=np.float32)
        self.counters = xp.zeros(len(COUNTERS), dtype=np.int64)
        self.ring_size = ring_size
        self.ring = xp.zeros((ring_size, STATS_DTYPE.itemsize), dtype=np.uint8)
        self.sample_stats = xp.zeros((batch, 3), dtype=np.float32)
        self.saved = xp.zeros((batch, max(1, cfg.n_layers - 1), layout.state_floats), dtype=np.float32)
        """Each layer's forward state but the last's, per sample (the backward reads it back)."""
        nq = cfg.n_actions * cfg.n_atoms
        self.q_online = xp.zeros((batch, nq), dtype=np.float32)
        self.q_target = xp.zeros((batch, nq), dtype=np.float32)
        self.q_target_now = xp.zeros((batch if settings.munchausen else 1, nq), dtype=np.float32)
        self.support = xp.linspace(cfg.v_min, cfg.v_max, cfg.n_atoms, dtype=np.float32)
        self.feat: Any = xp.zeros((1, cfg.n_features - 2), dtype=np.float32)

    def reset_optimizer(self) -> None:
        """Fresh Adam moments and step count; the target synced to the online network."""
        self.m[...] = 0.0
        self.v[...] = 0.0
        self.counters[0] = 0
        if self.target is not self.params:
            self.target[...] = self.params

    def enqueue(self) -> None:
        """Launch one update on the current stream (the batch already in ``inputs``)."""
        lay, b, s = self.layout, self.batch, self.settings
        i = self.inputs
        self._get("next_logits_kernel")(
            (b, 3 if s.munchausen else 2),
            (lay.threads,),
            (
                self.params,
                self.target,
                self.feat,
                i["t_next"],
                i["agent_next"],
                i["t_obs"],
                i["agent_obs"],
                self.q_online,
                self.q_target,
                self.q_target_now,
            ),
            shared_mem=lay.forward_shared,
        )
        self._get("backward_kernel")(
            (self.blocks,),
            (lay.threads,),
            (
                self.params,
                self.support,
                self.feat,
                i["t_obs"],
                i["agent_obs"],
                i["action"],
                i["reward"],
                i["discount"],
                i["label"],
                self.q_online,
                self.q_target,
                self.q_target_now,
                np.int32(s.munchausen),
                np.float32(s.m_alpha),
                np.float32(s.m_tau),
                np.float32(s.m_clip),
                np.float32(s.ret_weight),
                np.int32(b),
                np.int32(lay.total),
                self.partial,
                self.sample_stats,
                self.saved,
            ),
            shared_mem=lay.backward_shared,
        )
        self._get("reduce_kernel")(
            (self.n_sums,),
            (256,),
            (self.partial, np.int32(self.blocks), np.int32(lay.total), self.grad, self.sumsq),
        )
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
                shared_mem=lay.forward_shared,
            )


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
