"""The chunked SSD window form against the sequential recurrence, from zero state."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from agent.model import Array, Params, forward, init_params, to_numpy
from agent.model.mamba2 import _causal_conv, block_forward, ssd_chunked, ssd_ref
from agent.model.ops import silu, softplus
from tests.model.conftest import TINY


def _scan_inputs(
    xp: ModuleType, *, length: int, dt_range: tuple[float, float], dtype: type[np.floating]
) -> tuple[Array, Array, Array, Array, Array]:
    rng = np.random.default_rng(3)
    bt, heads, p, groups, n = 3, 4, 2, 2, 3
    values = (
        rng.standard_normal((bt, length, heads, p)),
        rng.uniform(*dt_range, size=(bt, length, heads)),
        -rng.uniform(1.0, 16.0, size=heads),
        rng.standard_normal((bt, length, groups, n)),
        rng.standard_normal((bt, length, groups, n)),
    )
    x, dt, A, B, C = (xp.asarray(v.astype(dtype)) for v in values)
    return x, dt, A, B, C


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_chunked_form_equals_the_step_recurrence(xp: ModuleType, chunk: int) -> None:
    x, dt, A, B, C = _scan_inputs(xp, length=7, dt_range=(0.01, 0.3), dtype=np.float64)
    expected, _ = ssd_ref(x, dt, A, B, C)
    got, _ = ssd_chunked(x, dt, A, B, C, chunk=chunk)
    np.testing.assert_allclose(to_numpy(got), to_numpy(expected), rtol=1e-12, atol=1e-12)
    last, _ = ssd_chunked(x, dt, A, B, C, chunk=chunk, last_only=True)
    np.testing.assert_allclose(to_numpy(last), to_numpy(expected)[:, -1:], rtol=1e-12, atol=1e-12)


def test_strong_decay_stays_finite_in_float32(xp: ModuleType) -> None:
    """dt = 0.1..1, A up to 16, L = 64: cumulative decays reach e^-1000, far past float32's
    range; the segment sums must never overflow (ALGORITHMS 6)."""
    x, dt, A, B, C = _scan_inputs(xp, length=64, dt_range=(0.1, 1.0), dtype=np.float32)
    got, _ = ssd_chunked(x, dt, A, B, C, chunk=64)
    x64, dt64, A64, B64, C64 = (a.astype(np.float64) for a in (x, dt, A, B, C))
    expected, _ = ssd_ref(x64, dt64, A64, B64, C64)
    assert bool(xp.isfinite(got).all())
    np.testing.assert_allclose(to_numpy(got), to_numpy(expected), rtol=1e-4, atol=1e-4)


def _block_step_reference(params: Params, prefix: str, u: Array) -> Array:
    """ALGORITHMS 1.3: one bar at a time with a conv state (last W raw rows, oldest first) and
    an SSM state, both zero at the start; returns the block output (Bt, L, d)."""
    xp = np
    W_in, conv_w, conv_b = params[prefix + "W_in"], params[prefix + "conv_w"], params[prefix + "conv_b"]
    di = params[prefix + "gnorm_w"].shape[0]
    heads = params[prefix + "A_log"].shape[0]
    cd, width = conv_w.shape
    groups = TINY.ngroups
    n = (cd - di) // (2 * groups)
    bt, length, _ = u.shape
    conv_state = xp.zeros((bt, cd, width))
    ssm_state = xp.zeros((bt, heads, di // heads, n))
    A = -xp.exp(params[prefix + "A_log"])
    outs = []
    for t in range(length):
        zxbcdt = u[:, t] @ W_in.T
        z, xbc_raw, dt_raw = zxbcdt[:, :di], zxbcdt[:, di : di + cd], zxbcdt[:, di + cd :]
        conv_state = xp.concatenate([conv_state[:, :, 1:], xbc_raw[:, :, None]], axis=2)
        xbc = silu((conv_state * conv_w).sum(axis=2) + conv_b)
        x = xbc[:, :di].reshape(bt, 1, heads, di // heads)
        B = xbc[:, di : di + groups * n].reshape(bt, 1, groups, n)
        C = xbc[:, di + groups * n :].reshape(bt, 1, groups, n)
        dt = softplus(dt_raw + params[prefix + "dt_bias"])[:, None]
        y, ssm_state = ssd_ref(x, dt, A, B, C, h0=ssm_state)
        y = (y[:, 0] + params[prefix + "D"][:, None] * x[:, 0]).reshape(bt, di)
        v = (y * silu(z)).reshape(bt, groups, di // groups)
        vhat = (v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + 1e-5)).reshape(bt, di)
        outs.append((vhat * params[prefix + "gnorm_w"]) @ params[prefix + "W_out"].T)
    return xp.stack(outs, axis=1)


@pytest.mark.parametrize("length", [1, 3, 4, 9])
@pytest.mark.parametrize("order", ["C", "F"])
def test_causal_conv_equals_its_definition(xp: ModuleType, length: int, order: str) -> None:
    """pre[t] = conv_b + sum_k conv_w[:, k] x[t - (W - 1) + k], zero before the window; windows
    shorter than the conv too, and conv_w row-major (training) or column-major (CPU runner)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, length, 6))
    w = rng.standard_normal((6, 4))
    b = rng.standard_normal(6)
    expected = np.empty_like(x)
    for t in range(length):
        taps = [w[:, k] * x[:, t - 3 + k] for k in range(4) if t - 3 + k >= 0]
        expected[:, t] = b + sum(taps)
    got = _causal_conv(xp.asarray(x), xp.asarray(w, order=order), xp.asarray(b))
    np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 2, TINY.window])
def test_block_window_form_equals_the_recurrent_step(chunk: int) -> None:
    """Every step's output, and the last step's alone (what the network's last block uses)."""
    rng = np.random.default_rng(11)
    params = init_params(TINY, rng, dtype=np.float64)
    params["blocks.0.dt_bias"] += 1.0
    u = rng.standard_normal((2, TINY.window, TINY.d_model))
    expected = _block_step_reference(params, "blocks.0.", u)
    got, _ = block_forward(params, "blocks.0.", u, TINY.ngroups, chunk)
    np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-12)
    last, _ = block_forward(params, "blocks.0.", u, TINY.ngroups, chunk, last_only=True)
    np.testing.assert_allclose(last, expected[:, -1:], rtol=1e-11, atol=1e-12)


def test_network_output_does_not_depend_on_the_chunk_length(xp: ModuleType) -> None:
    params = init_params(TINY, np.random.default_rng(5), xp, dtype=np.float64)
    x = xp.asarray(np.random.default_rng(6).standard_normal((3, TINY.window, TINY.n_features)))
    q_ref, r_ref, _ = forward(params, TINY, x, TINY.window)
    for chunk in (1, 2, 3):
        q, r, _ = forward(params, TINY, x, chunk)
        np.testing.assert_allclose(to_numpy(q), to_numpy(q_ref), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(to_numpy(r), to_numpy(r_ref), rtol=1e-12, atol=1e-12)


def test_windows_are_independent(xp: ModuleType) -> None:
    """Changing one window leaves the others' outputs untouched (no mixing across the batch)."""
    params = init_params(TINY, np.random.default_rng(5), xp, dtype=np.float64)
    x = np.random.default_rng(8).standard_normal((3, TINY.window, TINY.n_features))
    q_a, _, _ = forward(params, TINY, xp.asarray(x))
    x[1] += 1.0
    q_b, _, _ = forward(params, TINY, xp.asarray(x))
    np.testing.assert_array_equal(to_numpy(q_a)[[0, 2]], to_numpy(q_b)[[0, 2]])
    assert not np.allclose(to_numpy(q_a)[1], to_numpy(q_b)[1])


def test_block_is_causal(xp: ModuleType) -> None:
    """A change at bar t moves the block output at t and later, never before."""
    params = init_params(TINY, np.random.default_rng(12), xp, dtype=np.float64)
    u = np.random.default_rng(13).standard_normal((2, TINY.window, TINY.d_model))
    before, _ = block_forward(params, "blocks.0.", xp.asarray(u), TINY.ngroups, 2)
    u[:, 2] += 1.0
    after, _ = block_forward(params, "blocks.0.", xp.asarray(u), TINY.ngroups, 2)
    np.testing.assert_array_equal(to_numpy(before)[:, :2], to_numpy(after)[:, :2])
    assert not np.allclose(to_numpy(before)[:, 2:], to_numpy(after)[:, 2:])
