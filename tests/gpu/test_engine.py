"""The inference engine on the CPU path: bookkeeping, bad input, reproducibility, hot swap.

The CUDA path runs the same scenarios in test_engine_cuda.py (GPU only).
"""

from __future__ import annotations

import threading

import msgspec
import numpy as np
import pytest

from agent.gpu.backend import select_backend
from agent.gpu.cpu_runner import ROWS_PER_FORWARD
from agent.gpu.engine import Decision, InferenceEngine
from agent.gpu.errors import InferenceError, ModelLoadError
from agent.kernels.mamba_forward import mamba_forward_ref
from agent.kernels.softmax_ev import softmax_ev_ref
from agent.model.checkpoint import Checkpoint
from agent.model.config import ModelConfig
from agent.model.heads import c51_support, return_bin_centres
from agent.model.network import forward
from agent.policy.config import PolicyConfig
from agent.policy.kelly import kelly_size_ref
from agent.policy.thompson import thompson_ref
from tests.gpu.conftest import SMALL, make_checkpoint

POLICY = PolicyConfig(
    selection="thompson",
    seed=99,
    kelly_fraction=0.5,
    capital_per_contract=500.0,
    max_contracts=5,
    min_edge_ticks=0.1,
)
FEE = 0.5
TICKS = [12.5, 5.0, 50.0, 12.5, 10.0, 12.5]


def engine(ck: Checkpoint, device: str = "cpu", max_batch: int = 8) -> InferenceEngine:
    return InferenceEngine(
        ck,
        POLICY,
        TICKS,
        fee_per_contract=FEE,
        backend=select_backend(device),  # type: ignore[arg-type]
        max_batch=max_batch,
    )


def bars(seed: int, n_bars: int, rows: int, n_features: int = SMALL.n_features) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n_bars, rows, n_features)).astype(np.float32)


def feed(eng: InferenceEngine, history: np.ndarray, slots: list[int]) -> list[Decision]:
    return [eng.decide(slots, rows, np.zeros(len(slots)), 0.8) for rows in history]


def test_warm_up_then_decisions_follow_the_reference_pipeline() -> None:
    ck = make_checkpoint(seed=1, scale=3.0)
    eng = engine(ck)
    slots = [4, 0, 2]
    history = bars(2, SMALL.window + 3, len(slots))
    decisions = feed(eng, history, slots)
    assert [bool(d.valid.any()) for d in decisions[: SMALL.window - 1]] == [False] * (SMALL.window - 1)
    assert all(d.valid.all() for d in decisions[SMALL.window - 1 :])
    last = decisions[-1]
    np.testing.assert_array_equal(last.step, np.full(3, SMALL.window + 2, dtype=np.uint64))
    # Recompute the last decision from the references, step by step.
    window = np.zeros((len(TICKS), SMALL.window, SMALL.n_features), dtype=np.float32)
    window[slots] = history[-SMALL.window :].transpose(1, 0, 2)
    q_logits, ret_logits = mamba_forward_ref(
        ck.params, SMALL, window, slots, feature_mean=ck.norm_mean, feature_std=ck.norm_std
    )
    support, centres = c51_support(SMALL), return_bin_centres(SMALL)
    probs, q, _ = softmax_ev_ref(q_logits.reshape(-1, SMALL.n_atoms), support)
    np.testing.assert_allclose(last.q, q.reshape(3, 3), rtol=1e-4, atol=1e-4)
    r_probs, r_mean, _ = softmax_ev_ref(ret_logits, centres)
    np.testing.assert_allclose(last.ret_mean_ticks, r_mean, rtol=1e-4, atol=1e-4)
    draw = thompson_ref(probs.reshape(3, 3, -1), support, POLICY.seed, slots, last.step)
    np.testing.assert_array_equal(last.action, draw.action)
    np.testing.assert_array_equal(last.direction, draw.action - 1)
    sizing = kelly_size_ref(
        r_probs,
        centres,
        draw.action - 1,
        np.array(TICKS)[slots],
        np.full(3, 0.8),
        spread_ticks=history[-1][:, 2],  # the spread column of the checkpoint's inputs
        position=np.zeros(3),
        policy=POLICY,
        fee_per_contract=FEE,
    )
    np.testing.assert_array_equal(last.target, sizing.target)
    assert last.model_sha256 == ck.sha256


def test_greedy_selection_takes_the_best_expected_q() -> None:
    ck = make_checkpoint(seed=1, scale=3.0)
    history = bars(2, SMALL.window + 6, 3)
    thompson = feed(engine(ck), history, [4, 0, 2])
    greedy_engine = InferenceEngine(
        ck,
        msgspec.structs.replace(POLICY, selection="greedy"),
        TICKS,
        fee_per_contract=FEE,
        backend=select_backend("cpu"),
        max_batch=8,
    )
    greedy = feed(greedy_engine, history, [4, 0, 2])
    for t, g in zip(thompson, greedy, strict=True):
        np.testing.assert_array_equal(g.q, t.q)  # the same model outputs ...
        np.testing.assert_array_equal(g.action, np.argmax(g.q, axis=1))  # ... chosen by their mean
    # Thompson's draws disagree with the mean somewhere (else this case tests nothing).
    assert any((t.action != np.argmax(t.q, axis=1)).any() for t in thompson)


def test_unhealthy_or_non_finite_rows_keep_their_position_and_window() -> None:
    ck = make_checkpoint(seed=1, scale=3.0)
    eng = engine(ck)
    history = bars(3, SMALL.window, 2)
    feed(eng, history, [0, 1])
    before = eng.decide([0, 1], history[-1], [3, -2], 1.0, healthy=True)
    rows = history[-1].copy()
    rows[1, 2] = np.nan
    d = eng.decide([0, 1], rows, [3, -2], 1.0, healthy=[False, True])
    assert not d.valid.any()
    np.testing.assert_array_equal(d.target, [3, -2])
    assert (d.size == 0).all()
    # Neither window moved: the next healthy decision sees what it would have seen.
    ref = engine(ck)
    feed(ref, history, [0, 1])
    ref.decide([0, 1], history[-1], [3, -2], 1.0)
    ref.decide([0, 1], history[-1], [3, -2], 1.0, healthy=False)  # only advances the step
    a = eng.decide([0, 1], history[-1], [0, 0], 1.0)
    b = ref.decide([0, 1], history[-1], [0, 0], 1.0)
    np.testing.assert_array_equal(a.q, b.q)
    assert before.valid.all()


@pytest.mark.parametrize(
    ("slots", "rows", "message"),
    [
        ([0, 0], 2, "twice"),
        ([6], 1, "out of range"),
        ([-1], 1, "out of range"),
        ([], 0, "slots must be"),
        ([0, 1], 3, "features must be"),
        ([0.5], 1, "integers"),
    ],
)
def test_malformed_batches_raise_inference_error(slots: list[float], rows: int, message: str) -> None:
    eng = engine(make_checkpoint())
    with pytest.raises(InferenceError, match=message):
        eng.decide(slots, np.zeros((rows, SMALL.n_features)), np.zeros(len(slots)), 1.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ((99, 3), "twice"),
        ((0, 99), "twice"),
        ((50, 100), "out of range"),
        ((7, -1), "out of range"),
        ((50, 49), "twice"),  # still in order, not strictly
        ((99, 100), "out of range"),  # strictly increasing: the ends are the range
        ((0, -1), "out of range"),
    ],
)
def test_a_large_batch_is_checked_as_a_small_one(change: tuple[int, int], message: str) -> None:
    """Batches above a few rows take the NumPy form of the slot checks (one pass where the slots
    are strictly increasing, as the drivers' batches are): the same errors."""
    ck = make_checkpoint()
    eng = InferenceEngine(
        ck, POLICY, [0.25] * 100, fee_per_contract=FEE, backend=select_backend("cpu"), max_batch=100
    )
    slots = np.arange(100, dtype=np.uint64 if change[1] >= 0 else np.int64)
    eng.decide(slots, np.zeros((100, SMALL.n_features)), np.zeros(100), 1.0)  # well formed
    slots[change[0]] = change[1]
    with pytest.raises(InferenceError, match=message):
        eng.decide(slots, np.zeros((100, SMALL.n_features)), np.zeros(100), 1.0)
    np.testing.assert_array_equal(eng.decision_index(), np.ones(100))  # the bad batch changed nothing


@pytest.mark.parametrize("column", ["positions", "regime_scale", "healthy"])
def test_a_per_row_column_of_another_length_raises_and_changes_nothing(column: str) -> None:
    ck = make_checkpoint(seed=2, scale=3.0)
    eng, ref = engine(ck), engine(ck)
    history = bars(6, SMALL.window + 1, 3)
    feed(eng, history[:-1], [0, 1, 2])
    feed(ref, history[:-1], [0, 1, 2])
    args: dict[str, object] = {"positions": np.zeros(3), "regime_scale": 0.8, "healthy": True}
    args[column] = np.ones(2)  # two entries for three rows
    with pytest.raises(InferenceError, match="must have 3 entries"):
        eng.decide([0, 1, 2], history[-1], args["positions"], args["regime_scale"], args["healthy"])  # type: ignore[arg-type]
    np.testing.assert_array_equal(eng.decision_index(), ref.decision_index())
    a = eng.decide([0, 1, 2], history[-1], np.zeros(3), 0.8)
    b = ref.decide([0, 1, 2], history[-1], np.zeros(3), 0.8)
    np.testing.assert_array_equal(a.q, b.q)
    np.testing.assert_array_equal(a.step, b.step)
    assert a.valid.all()


def test_decision_index_counts_every_decision_of_a_slot() -> None:
    eng = engine(make_checkpoint())
    history = bars(7, 3, 2)
    eng.decide([0, 4], history[0], [0, 0], 1.0)
    eng.decide([4, 1], history[1], [0, 0], 1.0, healthy=[False, True])  # an unhealthy row counts too
    d = eng.decide([4], history[2][:1], [0], 1.0)
    np.testing.assert_array_equal(d.step, [2])
    np.testing.assert_array_equal(eng.decision_index(), [1, 1, 0, 0, 3, 0])
    assert eng.device_us() is None  # the CPU path has no device time


def test_batch_larger_than_max_batch_is_refused() -> None:
    eng = engine(make_checkpoint(), max_batch=2)
    with pytest.raises(InferenceError, match="1 to 2"):
        eng.decide([0, 1, 2], np.zeros((3, SMALL.n_features)), np.zeros(3), 1.0)


def test_decisions_are_reproducible_and_independent_of_batch_order() -> None:
    ck = make_checkpoint(seed=4, scale=3.0)
    history = bars(5, SMALL.window + 10, 4)
    a = feed(engine(ck), history, [0, 1, 2, 3])
    b = feed(engine(ck), history[:, ::-1], [3, 2, 1, 0])
    for da, db in zip(a, b, strict=True):
        np.testing.assert_array_equal(da.action, db.action[::-1])
        np.testing.assert_array_equal(da.target, db.target[::-1])
    actions = np.concatenate([d.action for d in a[SMALL.window :]])
    assert len(set(actions.tolist())) > 1  # the draws actually vary


def test_hot_swap_switches_models_between_decisions() -> None:
    old, new = make_checkpoint(seed=1, scale=3.0), make_checkpoint(seed=2, scale=3.0)
    history = bars(6, SMALL.window + 2, 3)
    eng = engine(old)
    feed(eng, history, [0, 1, 2])
    eng.load(new)
    assert eng.model_sha256 == new.sha256
    swapped = eng.decide([0, 1, 2], history[-1], np.zeros(3), 0.8)
    # The same history decided by an engine that served `new` from the start: same windows,
    # same steps, so the same decision.
    fresh = engine(new)
    feed(fresh, history, [0, 1, 2])
    expected = fresh.decide([0, 1, 2], history[-1], np.zeros(3), 0.8)
    assert swapped.model_sha256 == new.sha256
    np.testing.assert_array_equal(swapped.q, expected.q)
    np.testing.assert_array_equal(swapped.target, expected.target)


def test_failed_load_leaves_the_serving_model_untouched() -> None:
    ck = make_checkpoint(seed=1)
    eng = engine(ck)
    other_window = make_checkpoint(
        ModelConfig(n_features=SMALL.n_features, window=4, d_model=8, headdim=4), seed=3
    )
    other_features = make_checkpoint(
        ModelConfig(n_features=3, window=SMALL.window, d_model=8, headdim=4), seed=3
    )
    for bad in (other_window, other_features):
        with pytest.raises(ModelLoadError, match="restart to change the window shape"):
            eng.load(bad)
        assert eng.model_sha256 == ck.sha256
    d = eng.decide([0], np.zeros((1, SMALL.n_features)), [0], 1.0)
    assert d.model_sha256 == ck.sha256


def test_load_from_another_thread_never_mixes_models_within_a_decision() -> None:
    old, new = make_checkpoint(seed=1, scale=3.0), make_checkpoint(seed=2, scale=3.0)
    eng = engine(old)
    ref_old, ref_new = engine(old), engine(new)
    history = bars(7, 40, 2)
    loader = threading.Thread(target=eng.load, args=(new,))
    seen = set()
    for i, rows in enumerate(history):
        if i == 5:
            loader.start()
        d = eng.decide([0, 1], rows, np.zeros(2), 1.0)
        r_old = ref_old.decide([0, 1], rows, np.zeros(2), 1.0)
        r_new = ref_new.decide([0, 1], rows, np.zeros(2), 1.0)
        ref = r_old if d.model_sha256 == old.sha256 else r_new
        np.testing.assert_array_equal(d.q, ref.q)
        seen.add(d.model_sha256)
    loader.join()
    assert eng.model_sha256 == new.sha256
    assert new.sha256 in seen


def test_closed_engine_refuses_to_decide() -> None:
    eng = engine(make_checkpoint())
    eng.close()
    with pytest.raises(InferenceError, match="closed"):
        eng.decide([0], np.zeros((1, SMALL.n_features)), [0], 1.0)


def test_engine_rejects_bad_tick_values() -> None:
    with pytest.raises(ModelLoadError, match="tick_values"):
        InferenceEngine(
            make_checkpoint(),
            POLICY,
            [12.5, float("nan")],
            fee_per_contract=FEE,
            backend=select_backend("cpu"),
        )


def test_a_batch_over_rows_per_forward_matches_one_forward_over_all_rows() -> None:
    # The CPU runner evaluates large batches in slices of ROWS_PER_FORWARD windows: the same
    # q values as one forward call over the whole batch (rows are independent).
    ck = make_checkpoint(seed=8, scale=3.0)
    rows = 2 * ROWS_PER_FORWARD + 5
    eng = InferenceEngine(
        ck, POLICY, [12.5] * rows, fee_per_contract=FEE, backend=select_backend("cpu"), max_batch=rows
    )
    history = bars(9, SMALL.window, rows)
    last = feed(eng, history, list(range(rows)))[-1]
    assert last.valid.all()
    x = (history.transpose(1, 0, 2) - ck.norm_mean) / ck.norm_std
    params = {name: np.asarray(value, dtype=np.float32) for name, value in ck.params.items()}
    q_logits, _, _ = forward(params, SMALL, x.astype(np.float32))
    _, q, _ = softmax_ev_ref(q_logits.reshape(-1, SMALL.n_atoms), c51_support(SMALL))
    np.testing.assert_allclose(last.q, q.reshape(rows, 3), rtol=1e-6, atol=1e-6)
