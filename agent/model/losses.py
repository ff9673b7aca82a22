"""Losses of the two heads with their gradients at the logits (ALGORITHMS 2).

C51: the target distribution of a transition is the next state's distribution for the
target action (double DQN: chosen by the online network, read from the target network; the
trainer's business), shifted by the n-step reward and shrunk by ``gamma^n (1 - done)``,
then projected back onto the fixed support (:func:`c51_project`). The loss is the
cross-entropy of the taken action's distribution against it (:func:`c51_loss_and_grad`).

Return head: supervised cross-entropy against the bin of the realised return
(:func:`return_loss_and_grad`, bins from :func:`agent.model.heads.return_bin_of`).

Losses are batch means, returned as 0-d arrays (no device synchronisation); gradients have
the logits' shape and are those of that mean.
"""

from __future__ import annotations

from agent.model.arrays import Array, array_module
from agent.model.errors import ModelError
from agent.model.ops import log_softmax, softmax

__all__ = [
    "c51_loss_and_grad",
    "c51_project",
    "c51_project_ref",
    "munchausen_log_policy",
    "munchausen_project",
    "return_loss_and_grad",
]


def _check_batch(name: str, a: Array, batch: int, ndim: int) -> None:
    if a.ndim != ndim or a.shape[0] != batch:
        raise ModelError(f"{name}: expected {ndim}-d with batch {batch}, got shape {tuple(a.shape)}")


def _targets(next_probs: Array, rewards: Array, discounts: Array, support: Array) -> Array:
    """Shifted atoms T (B, N) = clip(r + discount * z, v_min, v_max)."""
    xp = array_module(next_probs, rewards, discounts, support)
    if next_probs.ndim != 2 or next_probs.shape[1] != support.shape[0]:
        raise ModelError(f"next_probs must be (B, {support.shape[0]}), got {tuple(next_probs.shape)}")
    _check_batch("rewards", rewards, next_probs.shape[0], 1)
    _check_batch("discounts", discounts, next_probs.shape[0], 1)
    if not bool(xp.isfinite(rewards).all() & ((discounts >= 0) & (discounts <= 1)).all()):
        raise ModelError("rewards must be finite and discounts (gamma^n * (1 - done)) within [0, 1]")
    shifted = rewards[:, None] + discounts[:, None] * support[None, :]
    return xp.clip(shifted, support[0], support[-1])


def c51_project(next_probs: Array, rewards: Array, discounts: Array, support: Array) -> Array:
    """Categorical projection, O(N) form: target distribution m (B, N), rows summing to 1.

    next_probs (B, N): target-network probabilities of the target action at s'; rewards (B):
    n-step discounted reward sums; discounts (B): ``gamma^n * (1 - done)``; support (N): the
    evenly spaced atoms. Each shifted atom's mass is split between its two neighbouring
    atoms; when it lands exactly on an atom (integer position: rewards on the grid, done
    transitions, rewards clipped at the support's ends) the pair is widened so the mass is
    not lost, and positions are clamped into [0, N-1] against rounding. Non-finite rewards or
    discounts outside [0, 1] raise :class:`ModelError`.
    """
    xp = array_module(next_probs, rewards, discounts, support)
    n = support.shape[0]
    batch = next_probs.shape[0]
    shifted = _targets(next_probs, rewards, discounts, support)
    dz = (support[-1] - support[0]) / (n - 1)
    b = xp.clip((shifted - support[0]) / dz, 0, n - 1)
    lower = xp.floor(b)
    upper = xp.ceil(b)
    lower = xp.where((upper > 0) & (lower == upper), lower - 1, lower)
    upper = xp.where((lower < n - 1) & (lower == upper), upper + 1, upper)
    rows = (xp.arange(batch) * n)[:, None]
    size = batch * n
    m = xp.bincount(
        (rows + lower.astype(xp.int64)).ravel(), weights=(next_probs * (upper - b)).ravel(), minlength=size
    ) + xp.bincount(
        (rows + upper.astype(xp.int64)).ravel(), weights=(next_probs * (b - lower)).ravel(), minlength=size
    )
    return m.reshape(batch, n).astype(next_probs.dtype)


def c51_project_ref(next_probs: Array, rewards: Array, discounts: Array, support: Array) -> Array:
    """Kernel form of :func:`c51_project` (O(N^2) memory; Dopamine's), the tests' reference:
    ``m_i = sum_j q_j clip(1 - |T_j - z_i| / dz, 0, 1)``."""
    xp = array_module(next_probs, rewards, discounts, support)
    shifted = _targets(next_probs, rewards, discounts, support)
    dz = (support[-1] - support[0]) / (support.shape[0] - 1)
    kernel = xp.clip(1.0 - xp.abs(shifted[:, None, :] - support[None, :, None]) / dz, 0.0, 1.0)  # (B, i, j)
    return (kernel * next_probs[:, None, :]).sum(axis=-1)


def munchausen_log_policy(q: Array, tau: float) -> Array:
    """``tau * log pi`` (B, A) of the softmax policy ``pi = softmax(q / tau)`` over mean Q-values
    ``q`` (B, A), in the tau-scaled log-sum-exp form (ALGORITHMS 2): ``q - max q - tau *
    log sum_a exp((q_a - max q) / tau)``, finite for any tau > 0."""
    xp = array_module(q)
    shifted = q - q.max(axis=-1, keepdims=True)
    return shifted - tau * xp.log(xp.exp(shifted / tau).sum(axis=-1, keepdims=True))


def munchausen_project(
    next_probs: Array,
    q_next: Array,
    q_now: Array,
    *,
    actions: Array,
    rewards: Array,
    discounts: Array,
    support: Array,
    alpha: float,
    tau: float,
    clip_low: float,
) -> Array:
    """Target distribution m (B, N) of Munchausen C51 (ALGORITHMS 2, the categorical analogue
    of M-DQN): the pi(.|s')-mixture of the target network's next-state distributions, each
    shifted by the reward, the Munchausen bonus and the discounted ``z - tau log pi(a'|s')``,
    projected in the kernel form.

    next_probs (B, A, N): the target network's distributions at s'; q_next (B, A) and q_now
    (B, A): its mean Q-values at s' and s; actions (B): the taken actions; rewards, discounts
    (B) as in :func:`c51_project`. ``bonus = alpha * clip(tau log pi(a|s), clip_low, 0)``.
    Rows sum to 1 (the projection's clamp keeps every atom's mass).
    """
    xp = array_module(next_probs, q_next, q_now, rewards, discounts, support)
    batch, _, n = next_probs.shape
    tlp_next = munchausen_log_policy(q_next, tau)  # (B, A)
    pi_next = xp.exp(tlp_next / tau)
    tlp_now = munchausen_log_policy(q_now, tau)
    bonus = alpha * xp.clip(tlp_now[xp.arange(batch), actions], clip_low, 0.0)  # (B,)
    shifted = (rewards + bonus)[:, None, None] + discounts[:, None, None] * (
        support[None, None, :] - tlp_next[:, :, None]
    )  # (B, A', N)
    shifted = xp.clip(shifted, support[0], support[-1])
    dz = (support[-1] - support[0]) / (n - 1)
    kernel = xp.clip(1.0 - xp.abs(shifted[:, :, None, :] - support[None, None, :, None]) / dz, 0.0, 1.0)
    weighted = next_probs * pi_next[:, :, None]  # (B, A', N_j)
    return (kernel * weighted[:, :, None, :]).sum(axis=(1, 3)).reshape(batch, n)


def c51_loss_and_grad(q_logits: Array, actions: Array, target_m: Array) -> tuple[Array, Array]:
    """Cross-entropy of the taken actions' distributions against projected targets.

    q_logits (B, A, N), actions (B) integer in [0, A), target_m (B, N) (a constant: no
    gradient flows into it) -> (mean loss (0-d), g_q_logits (B, A, N)), where only the taken
    action's logits get gradient ``(p * sum(m) - m) / B``.
    """
    xp = array_module(q_logits, actions, target_m)
    batch, n_actions, _ = q_logits.shape
    _check_batch("actions", actions, batch, 1)
    _check_batch("target_m", target_m, batch, 2)
    if bool(((actions < 0) | (actions >= n_actions)).any()):
        raise ModelError(f"actions must lie in [0, {n_actions})")
    rows = xp.arange(batch)
    taken = q_logits[rows, actions]
    loss = -(target_m * log_softmax(taken)).sum(axis=-1).mean()
    grad = xp.zeros_like(q_logits)
    grad[rows, actions] = (softmax(taken) * target_m.sum(axis=-1, keepdims=True) - target_m) / batch
    return loss, grad


def return_loss_and_grad(ret_logits: Array, target_bins: Array) -> tuple[Array, Array]:
    """Cross-entropy of the return head against realised bins.

    ret_logits (B, bins), target_bins (B) integer in [0, bins) -> (mean loss (0-d), g (B, bins)
    = (softmax - onehot) / B).
    """
    xp = array_module(ret_logits, target_bins)
    batch, bins = ret_logits.shape
    _check_batch("target_bins", target_bins, batch, 1)
    if bool(((target_bins < 0) | (target_bins >= bins)).any()):
        raise ModelError(f"target_bins must lie in [0, {bins})")
    rows = xp.arange(batch)
    loss = -log_softmax(ret_logits)[rows, target_bins].mean()
    grad = softmax(ret_logits)
    grad[rows, target_bins] -= 1.0
    return loss, grad / batch
