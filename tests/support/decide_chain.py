"""The whole-decision kernel (``decide.cu``) against the chain of references, as the CPU engine
runs them: the inputs of one batch and the check of its outputs, shared by the device test
(tests/gpu/test_kernels.py) and the CPU emulation's (tests/kernels/test_decide_emulated.py).

Tolerances: the stages' (window contents and counters exact, float32 moments to 1e-4, Kelly to
1e-3 relative from float32 against float64 probabilities), and actions drawn from float32
probabilities may flip where a draw lands within rounding of a CDF step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from agent.kernels.decide import RING_STALE, decide, out_dtype, ring_shape
from agent.kernels.kelly import kelly_size_ref
from agent.kernels.mamba_forward import VARIANTS, Variant, mamba_forward_ref
from agent.kernels.softmax_ev import softmax_ev_ref
from agent.kernels.thompson import thompson_ref
from agent.kernels.window_push import window_push_ref
from agent.model.checkpoint import Checkpoint
from agent.model.config import ModelConfig
from agent.model.heads import c51_support, return_bin_centres
from agent.policy.config import PolicyConfig
from agent.policy.kelly import leg_cost, regime_clamp
from agent.policy.thompson import greedy_ref
from tests.gpu.conftest import packed_for

__all__ = [
    "DecideInputs",
    "DecideState",
    "Launch",
    "check_decision",
    "check_launch",
    "check_reference_chain",
    "check_rings",
    "decide_policy",
    "launcher",
]


def decide_policy(selection: Literal["thompson", "greedy"]) -> PolicyConfig:
    """The policy the checks run with."""
    return PolicyConfig(
        selection=selection,
        seed=5,
        kelly_fraction=0.5,
        capital_per_contract=400.0,
        max_contracts=9,
        min_edge_ticks=0.1,
    )


@dataclass(frozen=True)
class DecideInputs:
    """One batch for the whole-decision kernel (fixed seed): 70 slots' windows, bar and step
    counters and tick values; ``rows`` rows (the last 3 padded) with their new feature rows (one NaN,
    one inf; the last column the book's spread in ticks), slots, health, positions and regime
    scales (two NaN)."""

    window: np.ndarray
    bars: np.ndarray
    steps: np.ndarray
    ticks: np.ndarray
    new: np.ndarray
    slots: np.ndarray
    healthy: np.ndarray
    positions: np.ndarray
    regime: np.ndarray

    @classmethod
    def draw(cls, cfg: ModelConfig, rows: int = 64) -> DecideInputs:
        rng = np.random.default_rng(10)
        slots_n = 70
        window = (rng.normal(size=(slots_n, cfg.window, cfg.n_features)) * 2).astype(np.float32)
        bars = rng.integers(cfg.window - 3, cfg.window + 2, size=slots_n).astype(np.uint64)
        steps = rng.integers(0, 2**40, size=slots_n, dtype=np.uint64)
        new = rng.normal(size=(rows, cfg.n_features)).astype(np.float32)
        new[3, 1] = np.nan  # not pushed, not valid
        new[4, 0] = np.inf
        new[:, -1] = rng.uniform(0.0, 2.0, size=rows)  # the book's spread in ticks
        slots = rng.permutation(slots_n)[:rows].astype(np.int32)
        slots[-3:] = -1  # padded rows
        healthy = rng.random(rows) > 0.2
        positions = rng.integers(-3, 4, size=rows).astype(np.int32)
        regime = rng.uniform(-0.2, 1.3, size=rows).astype(np.float32)
        regime[:2] = np.nan
        ticks = rng.choice([5.0, 12.5, 50.0], size=slots_n)
        return cls(window, bars, steps, ticks, new, slots, healthy, positions, regime)


def check_decision(
    ck: Checkpoint,
    cfg: ModelConfig,
    inputs: DecideInputs,
    raw: np.ndarray,
    *,
    window: np.ndarray,
    bars: np.ndarray,
    steps: np.ndarray,
    policy: PolicyConfig,
    fee: float,
) -> None:
    """The kernel's output bytes ``raw`` (rows, record size; poisoned with 255 before the
    launch) and the slots' window, bar and step counters after it, against the references on
    ``inputs`` (the book's spread in the last column)."""
    selection = policy.selection
    bars_after, steps_after = bars, steps
    bars, steps = inputs.bars.copy(), inputs.steps.copy()
    new, slots, a = inputs.new, inputs.slots, cfg.n_actions
    rows = slots.shape[0]
    record = out_dtype(a)
    got = raw.view(record).reshape(rows)
    live = slots >= 0
    assert (raw[~live] == 255).all()  # padded rows are not written
    g = got[live]
    n = int(live.sum())
    # The chain of references, as the CPU engine runs it.
    ref_window = inputs.window.copy()
    pushed = window_push_ref(ref_window, new, slots, inputs.healthy)
    np.testing.assert_array_equal(window, ref_window)
    assert not pushed[3] and not pushed[4]
    ok = pushed[live] & (bars[slots[live]] + 1 >= cfg.window)
    np.testing.assert_array_equal(g["valid"], ok)
    assert 0 < ok.sum() < n
    np.testing.assert_array_equal(g["step"], steps[slots[live]])
    assert (g["start_ns"] <= g["end_ns"]).all()  # both timer reads written (poison is all ones)
    assert (g["end_ns"] < np.uint64(0xFFFFFFFFFFFFFFFF)).all()
    bars[slots[live]] += pushed[live].astype(np.uint64)
    steps[slots[live]] += np.uint64(1)
    np.testing.assert_array_equal(bars_after, bars)
    np.testing.assert_array_equal(steps_after, steps)
    q_logits, r_logits = mamba_forward_ref(
        ck.params, cfg, ref_window, slots[live], feature_mean=ck.norm_mean, feature_std=ck.norm_std
    )
    support, centres = c51_support(cfg), return_bin_centres(cfg)
    probs, q, _ = softmax_ev_ref(q_logits.reshape(n * a, cfg.n_atoms), support)
    r_probs, r_mean, r_var = softmax_ev_ref(r_logits, centres)
    np.testing.assert_allclose(g["q"], q.reshape(n, a), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g["ret_mean"], r_mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g["ret_var"], r_var, rtol=1e-3, atol=1e-3)
    if selection == "greedy":
        assert (g["action"] == greedy_ref(q.reshape(n, a))).mean() >= 0.95
        np.testing.assert_array_equal(g["action"], greedy_ref(g["q"]))  # its own means, exactly
    else:
        draw = thompson_ref(probs.reshape(n, a, cfg.n_atoms), support, policy.seed, slots[live], g["step"])
        assert (g["action"] == draw.action).mean() >= 0.95
    np.testing.assert_array_equal(g["direction"], g["action"] - 1)
    _check_sizing(g, ok, r_probs, inputs, policy=policy, fee=fee, centres=centres)


def _check_sizing(
    g: np.ndarray,
    ok: np.ndarray,
    r_probs: np.ndarray,
    inputs: DecideInputs,
    *,
    policy: PolicyConfig,
    fee: float,
    centres: np.ndarray,
) -> None:
    """Kelly on the kernel's own actions ``g`` (its live rows; ``ok`` the valid ones): sizes
    from float32 vs float64 probabilities."""
    live = inputs.slots >= 0
    positions, regime = inputs.positions, inputs.regime
    d, tv, spread = g["action"] - 1, inputs.ticks[inputs.slots[live]], inputs.new[live, -1]
    sizing = kelly_size_ref(
        r_probs,
        centres,
        d,
        tv,
        regime[live],
        spread_ticks=spread,
        position=positions[live],
        policy=policy,
        fee_per_contract=fee,
    )
    np.testing.assert_array_equal(g["regime_scale"], regime_clamp(regime[live], policy.scale_floor))
    legs = np.abs(d - np.sign(positions[live]))
    required = legs * leg_cost(spread, tv, fee) + np.where(legs > 0, policy.min_edge_ticks * tv, 0.0)
    # not within rounding of the cost gate's threshold
    clear = np.abs(sizing.mean_return - required / policy.capital_per_contract) > 1e-6
    np.testing.assert_allclose(g["f_star"][clear], sizing.f_star[clear], rtol=1e-3)
    np.testing.assert_allclose(g["size"][ok & clear], sizing.size[ok & clear], rtol=1e-3)
    assert (g["size"][~ok] == 0).all()
    np.testing.assert_array_equal(g["target"][~ok], positions[live][~ok])
    raw_size = sizing.size * sizing.scale * policy.max_contracts
    away = ok & clear & (np.abs(raw_size - np.rint(raw_size)) > 1e-3)
    np.testing.assert_array_equal(g["target"][away], sizing.target[away])
    assert np.count_nonzero(g["target"][ok]) > 0  # the case exercises real sizes


@dataclass(frozen=True)
class DecideState:
    """What a decision launch updates in place (NumPy): the slots' windows and counters, and a
    model's ring of cached rows and its counters (``decide()``'s ``cache`` and ``cached``)."""

    window: np.ndarray
    bars: np.ndarray
    steps: np.ndarray
    cache: np.ndarray
    cached: np.ndarray

    @classmethod
    def before(cls, inputs: DecideInputs, cfg: ModelConfig) -> DecideState:
        """Copies of the inputs' windows and counters, and a stale ring (NaN: read before it is
        written, it would show in the decisions)."""
        return cls(
            inputs.window.copy(),
            inputs.bars.copy(),
            inputs.steps.copy(),
            np.full(ring_shape(cfg, inputs.bars.size), np.nan, np.float32),
            np.full(inputs.bars.size, RING_STALE),
        )


Launch = Callable[[Variant, DecideInputs, DecideState, PolicyConfig, float], np.ndarray]
"""Runs ``decide()`` in a variant on a batch's inputs and a state (updated in place), with a
policy and a fee a contract; returns the output bytes (rows, record size), poisoned with 255
before the launch."""


def launcher(xp: Any, ck: Checkpoint, kernel: Callable[[Variant], Any] | None = None) -> Launch:
    """A :data:`Launch` of ``ck``'s model on arrays of ``xp``: NumPy with the CPU emulation's
    kernel of each variant (``kernel``), or CuPy with the compiled kernels."""
    cfg = ck.config
    host = getattr(xp, "asnumpy", np.asarray)

    def launch(
        form: Variant, inputs: DecideInputs, state: DecideState, policy: PolicyConfig, fee: float
    ) -> Any:
        out = xp.full((inputs.slots.size, out_dtype(cfg.n_actions).itemsize), 255, dtype=xp.uint8)
        arrays = {
            name: xp.asarray(getattr(state, name)) for name in ("window", "bars", "steps", "cache", "cached")
        }
        decide(
            xp.asarray(packed_for(ck, form)),
            cfg,
            form,
            support=c51_support(cfg, xp),
            centres32=return_bin_centres(cfg, xp),
            centres64=return_bin_centres(cfg, xp, np.float64),
            tick_value=xp.asarray(inputs.ticks),
            rows=xp.asarray(inputs.new),
            slots=xp.asarray(inputs.slots),
            healthy=xp.asarray(inputs.healthy.astype(np.uint8)),
            positions=xp.asarray(inputs.positions),
            regime=xp.asarray(inputs.regime),
            policy=policy,
            fee_per_contract=fee,
            spread_column=cfg.n_features - 1,
            out=out,
            kernel=None if kernel is None else kernel(form),
            **arrays,
        )
        for name, array in arrays.items():
            getattr(state, name)[...] = host(array)
        return host(out)

    return launch


def check_launch(
    ck: Checkpoint,
    launch: Launch,
    form: Variant,
    inputs: DecideInputs,
    state: DecideState,
    *,
    policy: PolicyConfig,
    fee: float,
) -> None:
    """One launch on ``state`` (the inputs' windows and counters) against the reference chain."""
    out = launch(form, inputs, state, policy, fee)
    check_decision(
        ck,
        ck.config,
        inputs,
        out,
        window=state.window,
        bars=state.bars,
        steps=state.steps,
        policy=policy,
        fee=fee,
    )


def check_reference_chain(
    ck: Checkpoint, launch: Launch, form: Variant, selection: Literal["thompson", "greedy"], *, rows: int
) -> None:
    """One launch of ``form`` on ``rows`` freshly drawn rows (the windows' counters as drawn, a
    stale ring) against the reference chain, selecting by ``selection``."""
    inputs = DecideInputs.draw(ck.config, rows=rows)
    state = DecideState.before(inputs, ck.config)
    check_launch(ck, launch, form, inputs, state, policy=decide_policy(selection), fee=0.5)


def check_rings(ck: Checkpoint, launch: Launch) -> None:
    """Each variant decides a bar on a stale ring (the whole window computed and stored), then
    the next bar from its ring (the new row alone computed), both against the reference chain;
    then a batch of unhealthy rows (nothing pushed) on a stale ring computes the windows afresh.
    The rings must be the same bits in every variant and both ways (a ring one form wrote
    serves any), and the slots not decided keep a stale ring."""
    cfg = ck.config
    policy, fee = decide_policy("thompson"), 0.5
    first = DecideInputs.draw(cfg, rows=16)
    later = first.new.copy()
    noise = np.random.default_rng(3).normal(size=(later.shape[0], cfg.n_features - 1))
    later[:, :-1] += noise.astype(np.float32)
    live = first.slots[first.slots >= 0]
    rings = {}
    for name, form in VARIANTS.items():
        state = DecideState.before(first, cfg)
        inputs = first
        for rows in (first.new, later):
            inputs = dataclasses.replace(
                inputs, window=state.window.copy(), bars=state.bars.copy(), steps=state.steps.copy(), new=rows
            )
            check_launch(ck, launch, form, inputs, state, policy=policy, fee=fee)
            np.testing.assert_array_equal(state.cached[live], state.bars[live])
        assert (np.delete(state.cached, live) == RING_STALE).all()
        rings[name] = state.cache[live].copy()
        state.cached[live] = RING_STALE
        state.cache[...] = np.nan
        launch(form, dataclasses.replace(first, healthy=np.zeros_like(first.healthy)), state, policy, fee)
        np.testing.assert_array_equal(state.cache[live], rings[name], err_msg=f"{name}: ring computed afresh")
        np.testing.assert_array_equal(rings[name], rings["latency"], err_msg=f"{name} against latency")
