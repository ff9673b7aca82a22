"""Philox4x32-10: Random123 known-answer vectors and the stream layout of ALGORITHMS.md section 3."""

from __future__ import annotations

import numpy as np
import pytest

from agent.policy.philox import Purpose, philox4x32, philox_uniforms

KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_known_answers(counter: list[int], key: list[int], expected: list[int]) -> None:
    np.testing.assert_array_equal(philox4x32(counter, key), np.array(expected, dtype=np.uint32))


def test_vectorised_rows_equal_single_rows() -> None:
    counters = np.array([k[0] for k in KAT], dtype=np.uint32)
    keys = np.array([k[1] for k in KAT], dtype=np.uint32)
    np.testing.assert_array_equal(philox4x32(counters, keys), np.array([k[2] for k in KAT], dtype=np.uint32))


def test_uniforms_follow_the_stream_layout() -> None:
    seed, env, step = 0x0123456789ABCDEF, 7, 2**33 + 5
    bits = philox4x32(
        [step & 0xFFFFFFFF, step >> 32, env, (int(Purpose.THOMPSON) << 16) | 3],
        [seed & 0xFFFFFFFF, seed >> 32],
    )
    u = philox_uniforms(seed, env, step, Purpose.THOMPSON, block=3)
    assert u.dtype == np.float32
    np.testing.assert_array_equal(u, (bits >> 8).astype(np.float32) / np.float32(2**24))


def test_uniforms_are_in_unit_interval_and_do_not_depend_on_batch_order() -> None:
    env = np.arange(1000)
    step = np.arange(1000, dtype=np.uint64) * 3
    u = philox_uniforms(5, env, step, Purpose.THOMPSON)
    assert u.shape == (1000, 4) and (u >= 0).all() and (u < 1).all()
    order = np.random.default_rng(0).permutation(1000)
    np.testing.assert_array_equal(philox_uniforms(5, env[order], step[order], Purpose.THOMPSON), u[order])
    assert abs(float(u.mean()) - 0.5) < 0.02  # 4000 uniforms: the mean's sd is ~0.0046


def test_the_largest_word_maps_below_one() -> None:
    assert (np.uint32(0xFFFFFFFF) >> np.uint32(8)).astype(np.float32) * np.float32(2**-24) < 1.0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="counter"):
        philox4x32([0, 0, 0], [0, 0])
    with pytest.raises(ValueError, match="seed"):
        philox_uniforms(-1, 0, 0, Purpose.THOMPSON)
    with pytest.raises(ValueError, match="block"):
        philox_uniforms(0, 0, 0, Purpose.THOMPSON, block=2**16)
