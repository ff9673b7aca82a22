"""The baseline decider: random draws keyed by (seed, slot, decision index) whatever the block
they are generated in, and baselines stepped side by side deciding as each does alone."""

from __future__ import annotations

import numpy as np
import pytest

from agent.policy.philox import Purpose, philox_uniforms
from agent.trading.decider import BASELINES, BaselineDecider, DeciderError


def _run(decider: BaselineDecider, slots: np.ndarray, steps: int) -> list[np.ndarray]:
    positions = np.zeros(slots.shape[0], dtype=np.int64)
    healthy = np.ones(slots.shape[0], dtype=bool)
    out = []
    for _ in range(steps):
        d = decider.decide(
            slots, np.zeros((slots.shape[0], 1), np.float32), positions, np.ones(slots.shape[0]), healthy
        )
        out.append(d.action.copy())
    return out


def test_random_actions_are_the_philox_draws_of_each_decision() -> None:
    steps = BaselineDecider._BLOCK + 37  # crosses a block edge
    decider = BaselineDecider("random", 2, max_contracts=1, seed=9)
    actions = np.stack(_run(decider, np.asarray([0, 1]), steps))
    for slot in (0, 1):
        u = philox_uniforms(9, slot, np.arange(steps, dtype=np.uint64), Purpose.THOMPSON, block=1)[:, 0]
        np.testing.assert_array_equal(actions[:, slot], np.minimum((u * 3.0).astype(np.int32), 2))
    assert set(np.unique(actions).tolist()) == {0, 1, 2}


def test_side_by_side_baselines_decide_as_each_alone() -> None:
    n = 3
    together = BaselineDecider(BASELINES, n, max_contracts=2, seed=4)
    mixed = np.stack(_run(together, np.arange(n * len(BASELINES)), 50))
    for b, name in enumerate(BASELINES):
        alone = np.stack(_run(BaselineDecider(name, n, max_contracts=2, seed=4), np.arange(n), 50))
        np.testing.assert_array_equal(mixed[:, b * n : (b + 1) * n], alone, err_msg=name)


def test_unknown_baseline_is_refused() -> None:
    with pytest.raises(DeciderError, match="unknown baseline"):
        BaselineDecider(("flat", "short-only"), 1, max_contracts=1, seed=0)
