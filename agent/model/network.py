"""The whole network, forward and backward (DESIGN section 5).

x (B, K, F) -> embed (B, K, d) -> L pre-norm residual Mamba2 blocks ``h += block(rmsnorm(h)
* norm_w)`` -> last timestep (B, d) -> final RMSNorm -> C51 logits (B, A, atoms) and
return-head logits (B, bins). The window is evaluated from zero state (zero conv padding and
zero SSM state), the same in training and at every decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.model.arrays import Array, Params, array_module
from agent.model.config import ModelConfig
from agent.model.errors import ModelError
from agent.model.mamba2 import BlockCache, block_backward, block_forward
from agent.model.ops import linear, rmsnorm, rmsnorm_backward, sum_leading
from agent.model.params import block_prefix

__all__ = ["NetworkCache", "backward", "forward"]


@dataclass(frozen=True, slots=True)
class NetworkCache:
    """Activations :func:`forward` keeps for :func:`backward`."""

    x: Array  # input (B,K,F)
    norms: list[tuple[Array, Array]]  # per block: (normalised h, inverse RMS) of its pre-norm
    blocks: list[BlockCache]
    fhat: Array  # final-normalised last hidden state (B,d), before the weight
    fr: Array  # its inverse RMS (B,1,1)
    feat: Array  # fhat * final_norm_w (B,d), the heads' input


def forward(
    params: Params, cfg: ModelConfig, x: Array, chunk: int | None = None
) -> tuple[Array, Array, NetworkCache]:
    """Evaluate the network on windows x (B, K, F).

    Returns ``(q_logits (B, A, atoms), ret_logits (B, bins), cache)``; ``chunk`` overrides the
    SSD chunk length (default ``cfg.chunk``). The arrays' dtype and module (NumPy or CuPy) are
    those of ``params``/``x``. ``x`` must be finite and normalised: the feature pipeline keeps
    unhealthy states away from the model (this hot path does not scan for NaN).
    """
    if x.ndim != 3 or x.shape[1:] != (cfg.window, cfg.n_features):
        raise ModelError(f"model input must be (B, {cfg.window}, {cfg.n_features}), got {tuple(x.shape)}")
    xp = array_module(x)
    q_len = cfg.chunk if chunk is None else chunk
    h = linear(x, params["embed.W"]) + params["embed.b"]
    norms: list[tuple[Array, Array]] = []
    blocks: list[BlockCache] = []
    for i in range(cfg.n_layers):
        p = block_prefix(i)
        last = i == cfg.n_layers - 1  # only its last step is read: computed alone
        nhat, r = rmsnorm(h)
        out, bc = block_forward(params, p, nhat * params[p + "norm_w"], cfg.ngroups, q_len, last_only=last)
        h = (h[:, -1:] if last else h) + out
        norms.append((nhat, r))
        blocks.append(bc)
    fhat, fr = rmsnorm(h[:, -1])
    feat = fhat * params["final_norm_w"]
    q_logits = (xp.matmul(feat, params["q.W"].T) + params["q.b"]).reshape(-1, cfg.n_actions, cfg.n_atoms)
    ret_logits = xp.matmul(feat, params["ret.W"].T) + params["ret.b"]
    return q_logits, ret_logits, NetworkCache(x, norms, blocks, fhat, fr, feat)


def backward(
    params: Params, cfg: ModelConfig, cache: NetworkCache, g_q_logits: Array, g_ret_logits: Array
) -> tuple[Params, Array]:
    """Gradients of a scalar loss given its gradients at the two heads' logits.

    g_q_logits (B, A, atoms), g_ret_logits (B, bins) -> (grads with the keys and shapes of
    ``params``, gx (B, K, F)).
    """
    xp = array_module(g_q_logits, g_ret_logits)
    bsz = cache.x.shape[0]
    gq = g_q_logits.reshape(bsz, -1)
    grads: Params = {
        "q.W": xp.matmul(gq.T, cache.feat),
        "q.b": sum_leading(gq),
        "ret.W": xp.matmul(g_ret_logits.T, cache.feat),
        "ret.b": sum_leading(g_ret_logits),
    }
    gfeat = xp.matmul(gq, params["q.W"]) + xp.matmul(g_ret_logits, params["ret.W"])
    grads["final_norm_w"] = sum_leading(gfeat * cache.fhat)
    g_last = rmsnorm_backward(gfeat * params["final_norm_w"], cache.fhat, cache.fr)
    gh = xp.zeros((bsz, cfg.window, cfg.d_model), dtype=g_last.dtype)
    gh[:, -1] = g_last
    for i in range(cfg.n_layers - 1, -1, -1):
        p = block_prefix(i)
        gout = gh[:, -1:] if cache.blocks[i].last_only else gh
        block_grads, gn = block_backward(params, p, cache.blocks[i], gout)
        grads |= block_grads
        nhat, r = cache.norms[i]
        grads[p + "norm_w"] = sum_leading(gn * nhat)
        gh = gh + rmsnorm_backward(gn * params[p + "norm_w"], nhat, r)
    flat = gh.reshape(-1, cfg.d_model)
    grads["embed.W"] = xp.matmul(flat.T, cache.x.reshape(-1, cfg.n_features))
    grads["embed.b"] = sum_leading(flat)
    return grads, linear(gh, params["embed.W"].T)
