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
import functools
import sys

import numpy as np
import numpy.typing as npt

__all__ = ["Purpose", "philox4x32", "philox_uniforms"]

_MASK = np.uint64(0xFFFFFFFF)
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_ROUNDS = 10
_MULT = np.array([[0xD2511F53], [0xCD9E8D57]], dtype=np.uint64)
_BUMP = np.arange(_ROUNDS, dtype=np.uint64)[:, None, None] * np.array([[_W0], [_W1]], dtype=np.uint64)
"""Round r's key is (key + r * (W0, W1)) mod 2**32: its increments, (rounds, 2, 1)."""
_LO, _HI = (0, 1) if sys.byteorder == "little" else (1, 0)
"""Where the low and high uint32 halves of a uint64 lie in memory."""


class Purpose(enum.IntEnum):
    """What a stream of draws is for (the high 16 bits of counter word 3)."""

    THOMPSON = 1
    """One uniform per action for the Thompson choice (block 0: up to four actions)."""


def _schedule(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint32]:
    """The key of each round from keys (2, n) or (2, 1) -> (rounds, 2, n) uint32."""
    return (((keys & _MASK) + _BUMP) & _MASK).astype(np.uint32)


@functools.lru_cache(maxsize=16)
def _seed_schedule(seed: int) -> npt.NDArray[np.uint32]:
    """:func:`_schedule` of a 64-bit seed, (rounds, 2, 1): fixed per policy, so kept."""
    keys = _schedule(np.array([[seed & 0xFFFFFFFF], [seed >> 32]], dtype=np.uint64))
    keys.setflags(write=False)
    return keys


def _rounds(
    even: npt.NDArray[np.uint32], odd: npt.NDArray[np.uint32], keys: npt.NDArray[np.uint32]
) -> npt.NDArray[np.uint32]:
    """Ten rounds on uint32 words paired as even = (c0, c2), odd = (c1, c3), each (2, n), with
    the round keys of :func:`_schedule` -> the (n, 4) output words (c0, c1, c2, c3).

    Three array operations a round and no new arrays: the 64-bit products (both factors < 2**32:
    no overflow) go into one of two buffers, read back through fixed views as their uint32
    halves, pairs swapped; a round reads the previous round's buffer, so the two alternate."""
    n = even.shape[1]
    prods = np.empty((2, 2, n), dtype=np.uint64)
    halves = prods.view(np.uint32).reshape(2, 2, n, 2)[:, ::-1]  # (buffer, pair swapped, n, [lo, hi])
    buffers = [
        (prods[b], halves[b, :, :, _HI], halves[b, :, :, _LO], np.empty((2, n), np.uint32)) for b in (0, 1)
    ]
    for r, key in enumerate(keys):
        prod, hi, lo, xored = buffers[r & 1]
        np.multiply(_MULT, even, out=prod)
        even = np.bitwise_xor(hi, odd, out=xored)  # (hi1 ^ c1 ^ k0, hi0 ^ c3 ^ k1)
        even ^= key
        odd = lo  # (lo1, lo0)
    out = np.empty((n, 2, 2), dtype=np.uint32)
    out[:, :, 0] = even.T
    out[:, :, 1] = odd.T
    return out.reshape(n, 4)


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
    words = (np.broadcast_to(ctr, (*shape, 4)).reshape(-1, 4).T & _MASK).astype(np.uint32)
    keys = _schedule(np.broadcast_to(k, (*shape, 2)).reshape(-1, 2).T)
    return _rounds(words[0::2], words[1::2], keys).reshape(*shape, 4)


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
    counter = np.empty((4, *shape), dtype=np.uint64)  # rows c0, c2, c1, c3
    counter[0] = step64
    counter[1] = env64
    counter[2] = step64 >> np.uint64(32)
    counter[3] = (int(purpose) << 16) | block
    words = (counter.reshape(4, -1) & _MASK).astype(np.uint32)
    bits = _rounds(words[:2], words[2:], _seed_schedule(seed)) >> 8  # < 2**24: exact in float32
    return (bits.astype(np.float32) * np.float32(2.0**-24)).reshape(*shape, 4)
