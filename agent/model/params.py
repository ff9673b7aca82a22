"""Parameter layout, initialisation (ALGORITHMS 1.6) and the layout fingerprint.

The layout is a contract shared with :mod:`agent.gpu` (fused kernels index these tensors) and
with checkpoints. Parameters are a flat ``dict[str, array]``; with F features, d = d_model,
Di = d_inner, H heads, G groups, N = d_state, Cd = conv_dim, W = d_conv, A actions and
``atoms`` C51 atoms:

=========================  ===================  ===============================================
name                       shape                meaning
=========================  ===================  ===============================================
``embed.W``, ``embed.b``   (d, F), (d)          input embedding ``u = x W^T + b``
``blocks.i.norm_w``        (d)                  pre-norm RMSNorm weight of block i
``blocks.i.W_in``          (2Di+2GN+H, d)       in_proj, row blocks [z, x, B, C, dt], no bias
``blocks.i.conv_w``        (Cd, W)              causal depthwise conv over [x, B, C]
``blocks.i.conv_b``        (Cd)
``blocks.i.dt_bias``       (H)                  dt = softplus(dt_raw + dt_bias)
``blocks.i.A_log``         (H)                  A = -exp(A_log)
``blocks.i.D``             (H)                  skip, y += D x
``blocks.i.gnorm_w``       (Di)                 gated RMSNorm weight (gate before norm)
``blocks.i.W_out``         (d, Di)              out_proj, no bias
``final_norm_w``           (d)                  final RMSNorm weight
``q.W``, ``q.b``           (A*atoms, d), (..)   C51 logits, reshaped to [B, A, atoms]
``ret.W``, ``ret.b``       (bins, d), (bins)    return-head logits
=========================  ===================  ===============================================

Inside ``W_in`` (and the conv channels) head ``h`` reads group ``h // (H / G)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import ModuleType

import numpy as np

from agent.model.arrays import Array, Params
from agent.model.config import ModelConfig
from agent.model.errors import ModelError

__all__ = ["block_prefix", "init_params", "layout_fingerprint", "param_shapes"]

DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4
A_INIT_RANGE = (1.0, 16.0)


def block_prefix(i: int) -> str:
    """The name prefix of block ``i``'s tensors (``"blocks.i."``)."""
    return f"blocks.{i}."


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name with its shape, in a fixed order (needs a resolved ``n_features``)."""
    if cfg.n_features < 1:
        raise ModelError("model.n_features is 0: resolve it from the data with ModelConfig.with_features")
    d, di, h = cfg.d_model, cfg.d_inner, cfg.n_heads
    shapes: dict[str, tuple[int, ...]] = {"embed.W": (d, cfg.n_features), "embed.b": (d,)}
    for i in range(cfg.n_layers):
        p = block_prefix(i)
        shapes |= {
            p + "norm_w": (d,),
            p + "W_in": (cfg.in_proj_dim, d),
            p + "conv_w": (cfg.conv_dim, cfg.d_conv),
            p + "conv_b": (cfg.conv_dim,),
            p + "dt_bias": (h,),
            p + "A_log": (h,),
            p + "D": (h,),
            p + "gnorm_w": (di,),
            p + "W_out": (d, di),
        }
    shapes |= {
        "final_norm_w": (d,),
        "q.W": (cfg.n_actions * cfg.n_atoms, d),
        "q.b": (cfg.n_actions * cfg.n_atoms,),
        "ret.W": (cfg.return_bins, d),
        "ret.b": (cfg.return_bins,),
    }
    return shapes


def layout_fingerprint(params_or_shapes: Mapping[str, Array | tuple[int, ...]]) -> str:
    """sha256 hex digest of ``"name:d0,d1,...;"`` concatenated over the sorted names.

    Accepts parameters (anything with ``.shape``) or a name -> shape mapping such as
    :func:`param_shapes`; both give the same fingerprint for the same layout.
    """
    text = "".join(
        f"{name}:{','.join(str(int(n)) for n in getattr(value, 'shape', value))};"
        for name, value in sorted(params_or_shapes.items())
    )
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def init_params(
    cfg: ModelConfig,
    rng: np.random.Generator,
    xp: ModuleType = np,
    dtype: type[np.floating] = np.float32,
) -> Params:
    """Fresh parameters (ALGORITHMS 1.6), drawn on the host with ``rng``, placed with ``xp``.

    Linear layers (embed, W_in, W_out, heads) use PyTorch's default U(+-1/sqrt(fan_in)) for
    weights and biases; conv weights and bias U(+-1/sqrt(W)); norm weights and D are 1;
    ``dt = exp(U(ln 1e-3, ln 1e-1))`` clamped >= 1e-4 and stored as ``dt_bias =
    softplus^-1(dt)``; ``A_log = ln U(1, 16)``. The same seed gives the same parameters on
    every device.
    """
    host: dict[str, np.ndarray] = {}

    def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
        return rng.uniform(-bound, bound, size=shape)

    for name, shape in param_shapes(cfg).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("W", "W_in", "W_out"):
            host[name] = uniform(shape, shape[1] ** -0.5)
        elif leaf == "b":
            host[name] = uniform(shape, host[name[:-1] + "W"].shape[1] ** -0.5)
        elif leaf in ("conv_w", "conv_b"):
            host[name] = uniform(shape, cfg.d_conv**-0.5)
        elif leaf == "dt_bias":
            dt = np.exp(rng.uniform(np.log(DT_MIN), np.log(DT_MAX), size=shape))
            dt = np.maximum(dt, DT_FLOOR)
            host[name] = dt + np.log(-np.expm1(-dt))
        elif leaf == "A_log":
            host[name] = np.log(rng.uniform(*A_INIT_RANGE, size=shape))
        else:  # norm_w, gnorm_w, final_norm_w, D
            host[name] = np.ones(shape)
    return {name: xp.asarray(value.astype(dtype)) for name, value in host.items()}
