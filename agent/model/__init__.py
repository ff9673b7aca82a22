"""The learning core's model: Mamba2 encoder + C51 head + return head, on NumPy or CuPy.

One implementation of forward and backward, written against the array module of its inputs
(:mod:`agent.model.arrays`); the fused CUDA kernels of :mod:`agent.kernels` are checked
against it. Contract shared with :mod:`agent.gpu` and the trainer:

* configuration: :class:`ModelConfig` (``[model]`` in the TOML files);
* parameters: a flat ``dict[str, array]`` whose names and shapes are listed in
  :mod:`agent.model.params` (``param_shapes``); ``layout_fingerprint`` = sha256 of
  ``"name:d0,d1,...;"`` over the sorted names identifies a layout;
* ``init_params(cfg, rng, xp=np, dtype=np.float32) -> Params``;
* ``forward(params, cfg, x (B,K,F)) -> (q_logits (B,A,atoms), ret_logits (B,bins), cache)``
  and ``backward(params, cfg, cache, g_q_logits, g_ret_logits) -> (grads, gx)``;
* heads: ``q_probs``, ``ret_probs``, ``expected_q``, ``c51_support``, ``return_bin_centres``,
  ``return_bin_of``, ``return_moments`` (:mod:`agent.model.heads`);
* losses: ``c51_project``, ``c51_loss_and_grad``, ``return_loss_and_grad``
  (:mod:`agent.model.losses`);
* optimiser: ``Adam``, ``clip_grad_norm`` (:mod:`agent.model.optim`);
* checkpoints: ``checkpoint_to_bytes``, ``checkpoint_from_bytes``, ``write_checkpoint``,
  ``read_checkpoint`` (:mod:`agent.model.checkpoint`).
"""

from agent.model.arrays import Array, Params, array_module, to_numpy
from agent.model.checkpoint import (
    Checkpoint,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    read_checkpoint,
    sha256_hex,
    write_checkpoint,
)
from agent.model.config import ModelConfig
from agent.model.errors import CheckpointError, ModelError, NonFiniteError
from agent.model.heads import (
    ACTIONS,
    c51_support,
    expected_q,
    q_probs,
    ret_probs,
    return_bin_centres,
    return_bin_of,
    return_moments,
)
from agent.model.losses import c51_loss_and_grad, c51_project, return_loss_and_grad
from agent.model.network import NetworkCache, backward, forward
from agent.model.optim import Adam, AdamState, clip_grad_norm
from agent.model.params import init_params, layout_fingerprint, param_shapes

__all__ = [
    "ACTIONS",
    "Adam",
    "AdamState",
    "Array",
    "Checkpoint",
    "CheckpointError",
    "ModelConfig",
    "ModelError",
    "NetworkCache",
    "NonFiniteError",
    "Params",
    "array_module",
    "backward",
    "c51_loss_and_grad",
    "c51_project",
    "c51_support",
    "checkpoint_from_bytes",
    "checkpoint_to_bytes",
    "clip_grad_norm",
    "expected_q",
    "forward",
    "init_params",
    "layout_fingerprint",
    "param_shapes",
    "q_probs",
    "read_checkpoint",
    "ret_probs",
    "return_bin_centres",
    "return_bin_of",
    "return_loss_and_grad",
    "return_moments",
    "sha256_hex",
    "to_numpy",
    "write_checkpoint",
]
