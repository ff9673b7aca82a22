"""The Decider contract: the arrays of a returned decision are the caller's (the drivers keep a
run's decisions and log them together), for the model's decider and the baselines."""

from __future__ import annotations

import dataclasses

import numpy as np

from agent.model.checkpoint import checkpoint_from_bytes
from agent.policy.config import PolicyConfig
from agent.trading.decider import BaselineDecider, Decided, Decider, ModelDecider
from tests.daemon.support import model_checkpoint


def _snapshot(d: Decided) -> dict[str, np.ndarray]:
    return {f.name: np.array(getattr(d, f.name)) for f in dataclasses.fields(Decided)}


def _assert_kept(decider: Decider, n_features: int) -> None:
    rng = np.random.default_rng(0)
    slots = np.array([0, 1], dtype=np.int64)
    healthy = np.ones(2, dtype=bool)
    positions = np.zeros(2, dtype=np.int64)
    regime = np.ones(2)
    first = decided = None
    for step in range(decider.window + 3):  # past the window, so that decisions are valid
        rows = rng.normal(size=(2, n_features)).astype(np.float32)
        decided = decider.decide(slots, rows, positions, regime, healthy)
        if step == decider.window:
            first, kept = decided, _snapshot(decided)
    assert first is not None and decided is not None and first is not decided
    healthy[:] = False  # the caller reusing its own input arrays
    positions[:] = 7
    for name, value in kept.items():
        np.testing.assert_array_equal(getattr(first, name), value, err_msg=name)


def test_the_model_deciders_decisions_survive_later_calls() -> None:
    blob, _ = model_checkpoint()
    checkpoint = checkpoint_from_bytes(blob)
    decider = ModelDecider(checkpoint, PolicyConfig(), [12.5, 5.0], "cpu", fee_per_contract=1.0, max_batch=2)
    try:
        _assert_kept(decider, checkpoint.config.n_features)
    finally:
        decider.close()


def test_the_baselines_decisions_survive_later_calls() -> None:
    _assert_kept(BaselineDecider(("random", "long"), 1, 2, seed=3), 4)
