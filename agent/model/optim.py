"""Adam (with optional decoupled weight decay) and global-norm gradient clipping.

The optimiser's state is arrays keyed by parameter name plus a step count
(:class:`AdamState`), so it checkpoints with the parameters and resumes bit for bit.
Weight decay, when set, applies only to matrices (tensors with ndim >= 2): never to biases,
norm weights, ``dt_bias``, ``A_log`` or ``D`` (ALGORITHMS 1.6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.model.arrays import Params, array_module
from agent.model.errors import ModelError, NonFiniteError

__all__ = ["Adam", "AdamState", "clip_grad_norm"]


@dataclass(frozen=True, slots=True)
class AdamState:
    """Everything needed to resume :class:`Adam`: hyper-parameters, step and moments."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    step: int
    m: Params
    v: Params


class Adam:
    """Adam over a parameter dict, updated in place (the arrays keep their identity).

    Defaults are Dopamine's C51 settings (lr 2.5e-4, eps 3.125e-4; ALGORITHMS 2).
    """

    def __init__(
        self,
        params: Params,
        *,
        lr: float = 2.5e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 3.125e-4,
        weight_decay: float = 0.0,
    ) -> None:
        if not lr > 0.0 or not eps > 0.0 or weight_decay < 0.0:
            raise ModelError(f"Adam needs lr, eps > 0 and weight_decay >= 0; got {lr}, {eps}, {weight_decay}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ModelError(f"Adam betas must lie in [0, 1), got {betas}")
        self.lr = lr
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.step = 0
        xp = array_module(*params.values())
        self.m: Params = {name: xp.zeros_like(p) for name, p in params.items()}
        self.v: Params = {name: xp.zeros_like(p) for name, p in params.items()}

    @classmethod
    def from_state(cls, state: AdamState, params: Params) -> Adam:
        """Resume from ``state`` (e.g. a checkpoint's), moved to ``params``' array module."""
        opt = cls(
            params,
            lr=state.lr,
            betas=(state.beta1, state.beta2),
            eps=state.eps,
            weight_decay=state.weight_decay,
        )
        for moments, target in ((state.m, opt.m), (state.v, opt.v)):
            if set(moments) != set(target):
                raise ModelError("optimiser state does not match the parameters' names")
            for name, value in moments.items():
                if tuple(value.shape) != tuple(target[name].shape):
                    raise ModelError(f"optimiser state {name}: shape {value.shape} != {target[name].shape}")
                target[name][...] = array_module(target[name]).asarray(value)
        opt.step = state.step
        return opt

    def state(self) -> AdamState:
        """A snapshot of the state (copies of the moments)."""
        return AdamState(
            lr=self.lr,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            step=self.step,
            m={name: a.copy() for name, a in self.m.items()},
            v={name: a.copy() for name, a in self.v.items()},
        )

    def update(self, params: Params, grads: Params) -> None:
        """One Adam step: ``p -= lr * mhat / (sqrt(vhat) + eps)`` (+ decoupled decay)."""
        if set(grads) != set(self.m) or set(params) != set(self.m):
            raise ModelError("Adam.update: parameter/gradient names differ from the optimiser's")
        self.step += 1
        bc1 = 1.0 - self.beta1**self.step
        bc2 = 1.0 - self.beta2**self.step
        xp = array_module(*params.values())
        for name, p in params.items():
            g = grads[name]
            m, v = self.m[name], self.v[name]
            m *= self.beta1
            m += (1.0 - self.beta1) * g
            v *= self.beta2
            v += (1.0 - self.beta2) * (g * g)
            if self.weight_decay and p.ndim >= 2:
                xp.multiply(p, 1.0 - self.lr * self.weight_decay, out=p)
            xp.subtract(p, (self.lr / bc1) * m / (xp.sqrt(v / bc2) + self.eps), out=p)


def clip_grad_norm(grads: Params, max_norm: float) -> float:
    """Scale ``grads`` in place so their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping. A NaN or infinite norm raises
    :class:`NonFiniteError` and leaves the gradients untouched (the step must be skipped).
    """
    if not max_norm > 0.0:
        raise ModelError(f"max_norm must be > 0, got {max_norm}")
    xp = array_module(*grads.values())
    total = math.sqrt(float(sum(xp.square(g).sum(dtype=xp.float64) for g in grads.values())))
    if not math.isfinite(total):
        raise NonFiniteError(f"gradient norm is {total}: the update is rejected")
    if total > max_norm:
        scale = max_norm / (total + 1e-6)
        for g in grads.values():
            xp.multiply(g, scale, out=g)
    return total
