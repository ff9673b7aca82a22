"""Thompson choice by inverse CDF (ALGORITHMS.md section 3)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.policy.philox import Purpose, philox_uniforms
from agent.policy.thompson import thompson_ref

SUPPORT = np.linspace(-10, 10, 51, dtype=np.float32)


def test_certain_distributions_draw_their_atom_and_pick_the_best() -> None:
    probs = np.zeros((1, 3, 51), dtype=np.float32)
    probs[0, 0, 10], probs[0, 1, 30], probs[0, 2, 20] = 1.0, 1.0, 1.0
    for step in range(20):
        draw = thompson_ref(probs, SUPPORT, 1, [0], [step])
        np.testing.assert_array_equal(draw.value[0], SUPPORT[[10, 30, 20]])
        assert draw.action[0] == 1


def test_ties_go_to_the_lowest_action() -> None:
    probs = np.zeros((4, 3, 51), dtype=np.float32)
    probs[:, :, 25] = 1.0
    assert (thompson_ref(probs, SUPPORT, 3, np.arange(4), np.zeros(4, np.uint64)).action == 0).all()
    probs[:, 0, 25], probs[:, 0, 0] = 0.0, 1.0  # action 0 now worse: the tie is between 1 and 2
    assert (thompson_ref(probs, SUPPORT, 3, np.arange(4), np.zeros(4, np.uint64)).action == 1).all()


def test_index_is_the_first_cdf_entry_above_u_times_the_total() -> None:
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(51), size=(200, 3)).astype(np.float32) * np.float32(0.6)  # unnormalised
    env, step = np.arange(200), rng.integers(0, 10**9, size=200).astype(np.uint64)
    draw = thompson_ref(probs, SUPPORT, 9, env, step)
    u = philox_uniforms(9, env, step, Purpose.THOMPSON)
    for b in range(200):
        for a in range(3):
            cdf = np.float32(0.0)
            j = 50
            threshold = u[b, a] * np.add.accumulate(probs[b, a], dtype=np.float32)[-1]
            for i in range(51):
                cdf = np.float32(cdf + probs[b, a, i])
                if cdf > threshold:
                    j = i
                    break
            assert draw.value[b, a] == SUPPORT[j]


def test_all_zero_probabilities_clamp_to_the_last_atom() -> None:
    draw = thompson_ref(np.zeros((2, 3, 51), dtype=np.float32), SUPPORT, 0, [0, 1], [0, 0])
    assert (draw.value == SUPPORT[-1]).all()


def test_draw_frequencies_follow_the_distribution() -> None:
    p = np.array([0.2, 0.5, 0.3], dtype=np.float32)
    probs = np.broadcast_to(p, (20000, 1, 3)).copy()
    draw = thompson_ref(
        probs, np.array([0.0, 1.0, 2.0], dtype=np.float32), 4, np.zeros(20000), np.arange(20000)
    )
    freq = np.bincount(draw.value[:, 0].astype(int), minlength=3) / 20000
    np.testing.assert_allclose(freq, p, atol=0.015)  # binomial sd <= 0.0036


def test_more_than_four_actions_is_refused() -> None:
    with pytest.raises(ValueError, match="A<=4"):
        thompson_ref(np.ones((1, 5, 3), dtype=np.float32), np.zeros(3, np.float32), 0, [0], [0])
