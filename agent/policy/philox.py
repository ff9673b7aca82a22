"""Philox4x32-10, the counter-based generator of every policy draw (ALGORITHMS.md section 3).

Hand-written so that this NumPy reference and the CUDA twin (``agent/kernels/philox.cuh``) give
the same bits for the same (key, counter); ``numpy.random.Philox`` is Philox4x64 and curand has
another counter layout, so neither is used.

Stream layout: key = (seed_lo, seed_hi); counter = (step_lo, step_hi, env, purpose << 16 | block).
Each call yields four 32-bit words; a uniform is ``(x >> 8) * 2**-24``, exactly representable
in float32 and in [0, 1). A draw is therefore a pure function of (seed, env, step, purpose,
block): it does not depend on batch order, launch geometry or device.
"""

from __future__ import annotations

import enum

import numpy as np
import numpy.typing as npt

__all__ = ["Purpose", "philox4x32", "philox_uniforms"]

_MASK = np.uint64(0xFFFFFFFF)
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_ROUNDS = 10
_SHIFT = np.uint64(32)
_MULT = np.array([[_M0], [_M1]], dtype=np.uint64)
_BUMP = np.array([[_W0], [_W1]], dtype=np.uint64)


class Purpose(enum.IntEnum):
    """What a stream of draws is for (the high 16 bits of counter word 3)."""

    THOMPSON = 1
    """One uniform per action for the Thompson choice (block 0: up to four actions)."""


def _rounds(
    even: npt.NDArray[np.uint64], odd: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Ten rounds on words paired as even = (c0, c2), odd = (c1, c3), each (2, n); keys (2, n)
    or (2, 1). Five array operations a round (plus the key schedule)."""
    for _ in range(_ROUNDS):
        p = _MULT * even  # both factors < 2**32: the 64-bit product cannot overflow
        lo = p & _MASK
        even = (p >> _SHIFT)[::-1] ^ odd ^ keys  # (hi1 ^ c1 ^ k0, hi0 ^ c3 ^ k1)
        odd = lo[::-1]  # (lo1, lo0)
        keys = (keys + _BUMP) & _MASK
    return even, odd


def _words(even: npt.NDArray[np.uint64], odd: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """(n, 4) output words (c0, c1, c2, c3) from the paired form."""
    return np.stack([even[0], odd[0], even[1], odd[1]], axis=-1)


def philox4x32(counter: npt.ArrayLike, key: npt.ArrayLike) -> npt.NDArray[np.uint32]:
    """Philox4x32-10 block function.

    Args:
        counter: (..., 4) unsigned 32-bit words.
        key: (..., 2) unsigned 32-bit words; broadcast against ``counter``'s leading shape.

    Returns:
        (..., 4) uint32 output words.
    """
    ctr = np.asarray(counter, dtype=np.uint64)
    k = np.asarray(key, dtype=np.uint64)
    if ctr.shape[-1:] != (4,) or k.shape[-1:] != (2,):
        raise ValueError(f"philox4x32 wants counter (..., 4) and key (..., 2), got {ctr.shape}, {k.shape}")
    shape = np.broadcast_shapes(ctr.shape[:-1], k.shape[:-1])
    words = np.broadcast_to(ctr, (*shape, 4)).reshape(-1, 4).T & _MASK
    keys = np.broadcast_to(k, (*shape, 2)).reshape(-1, 2).T & _MASK
    even, odd = _rounds(words[0::2], words[1::2], keys)
    return _words(even, odd).reshape(*shape, 4).astype(np.uint32)


def philox_uniforms(
    seed: int,
    env: npt.ArrayLike,
    step: npt.ArrayLike,
    purpose: Purpose,
    block: int = 0,
) -> npt.NDArray[np.float32]:
    """Four uniforms in [0, 1) per (env, step), float32, shape ``broadcast(env, step).shape + (4,)``.

    Args:
        seed: 64-bit key (``PolicyConfig.seed``).
        env: instrument slot or environment index, 0 <= env < 2**32.
        step: decision index of that env, 0 <= step < 2**64.
        purpose: which stream (:class:`Purpose`).
        block: 0 <= block < 2**16, for more than four draws of one purpose.
    """
    if not 0 <= seed < 2**64 or not 0 <= block < 2**16:
        raise ValueError("seed must be in [0, 2**64) and block in [0, 2**16)")
    env64 = np.asarray(env, dtype=np.uint64)
    step64 = np.asarray(step, dtype=np.uint64)
    shape = np.broadcast_shapes(env64.shape, step64.shape)
    env64 = np.broadcast_to(env64, shape).ravel() & _MASK
    step64 = np.broadcast_to(step64, shape).ravel()
    word3 = np.full_like(env64, (int(purpose) << 16) | block)
    keys = np.array([[seed & 0xFFFFFFFF], [seed >> 32]], dtype=np.uint64)
    even, odd = _rounds(np.stack([step64 & _MASK, env64]), np.stack([step64 >> _SHIFT, word3]), keys)
    bits = _words(even, odd) >> np.uint64(8)  # < 2**24: exact in float32
    return (bits.astype(np.float32) * np.float32(2.0**-24)).reshape(*shape, 4)
