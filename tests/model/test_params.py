"""Configuration validation, parameter layout, fingerprint and initialisation statistics."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import agent.model
from agent.config import ConfigError, load_config
from agent.model import ModelConfig, ModelError, init_params, layout_fingerprint, param_shapes, to_numpy
from agent.model.ops import softplus
from tests.model.conftest import TINY

DEFAULT = ModelConfig(n_features=24)


def test_default_layout_names_and_shapes() -> None:
    shapes = param_shapes(DEFAULT)
    assert shapes["embed.W"] == (64, 24)
    assert shapes["blocks.1.W_in"] == (2 * 128 + 2 * 16 + 8, 64)  # [z, x, B, C, dt]
    assert shapes["blocks.0.conv_w"] == (128 + 32, 4)
    assert shapes["blocks.0.A_log"] == (8,)
    assert shapes["blocks.0.gnorm_w"] == (128,)
    assert shapes["blocks.0.W_out"] == (64, 128)
    assert shapes["q.W"] == (3 * 51, 64)
    assert shapes["ret.W"] == (21, 64)
    assert len(shapes) == 2 + 9 * DEFAULT.n_layers + 5  # embed, blocks, final norm + heads


def test_fingerprint_pins_names_and_shapes(xp: ModuleType) -> None:
    params = init_params(DEFAULT, np.random.default_rng(0), xp)
    assert layout_fingerprint(params) == layout_fingerprint(param_shapes(DEFAULT))
    text = "".join(f"{n}:{','.join(map(str, s))};" for n, s in sorted(param_shapes(DEFAULT).items()))
    assert layout_fingerprint(param_shapes(DEFAULT)) == hashlib.sha256(text.encode()).hexdigest()
    assert layout_fingerprint(param_shapes(ModelConfig(n_features=25))) != layout_fingerprint(params)
    renamed = {("x" + n if n == "q.b" else n): p for n, p in params.items()}
    assert layout_fingerprint(renamed) != layout_fingerprint(params)


def test_init_statistics(xp: ModuleType) -> None:
    cfg = ModelConfig(n_features=5, d_model=256, n_layers=3)  # 32 heads per block
    params = init_params(cfg, np.random.default_rng(1), xp)
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        dt = to_numpy(softplus(params[p + "dt_bias"].astype(np.float64)))
        assert ((dt >= 1e-3 * (1 - 1e-6)) & (dt <= 1e-1 * (1 + 1e-6))).all()
        A = np.exp(to_numpy(params[p + "A_log"]).astype(np.float64))
        assert ((A >= 1.0 - 1e-6) & (A <= 16.0 + 1e-6)).all()
        assert A.std() > 1.0  # spread over the range, not a constant
        np.testing.assert_array_equal(to_numpy(params[p + "D"]), 1.0)
        np.testing.assert_array_equal(to_numpy(params[p + "norm_w"]), 1.0)
        np.testing.assert_array_equal(to_numpy(params[p + "gnorm_w"]), 1.0)
        W_in = to_numpy(params[p + "W_in"])
        assert np.abs(W_in).max() <= cfg.d_model**-0.5
        assert W_in.std() == pytest.approx(cfg.d_model**-0.5 / np.sqrt(3), rel=0.05)
        assert np.abs(to_numpy(params[p + "W_out"])).max() <= cfg.d_inner**-0.5
        assert np.abs(to_numpy(params[p + "conv_w"])).max() <= 0.5
    assert all(a.dtype == np.float32 for a in params.values())


def test_init_is_reproducible_and_device_independent(xp: ModuleType) -> None:
    a = init_params(TINY, np.random.default_rng(3), xp)
    b = init_params(TINY, np.random.default_rng(3))
    for name, value in a.items():
        np.testing.assert_array_equal(to_numpy(value), b[name])


def test_unresolved_feature_count_is_an_error() -> None:
    with pytest.raises(ModelError, match="n_features is 0"):
        param_shapes(ModelConfig())
    assert ModelConfig().with_features(30).n_features == 30
    with pytest.raises(ModelError, match="fixes n_features = 24"):
        DEFAULT.with_features(30)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("headdim = 48", r"key 'model': headdim 48 must divide d_inner"),
        ("ngroups = 3", "ngroups 3 must divide"),
        ("v_min = 10.0", r"v_min \(10.0\) must be below v_max"),
        ("n_atoms = 1", "n_atoms must be >= 2"),
        ("window = 0", "window must be >= 1"),
        ("dueling = true", r"key 'model\.dueling'"),
    ],
)
def test_bad_model_config_is_rejected_with_the_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(f"[model]\n{toml}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path, env={})


def test_public_surface_is_pinned() -> None:
    assert set(agent.model.__all__) == {
        "ACTIONS", "Adam", "AdamState", "Array", "Checkpoint", "CheckpointError", "ModelConfig",
        "ModelError", "NetworkCache", "NonFiniteError", "Params", "array_module", "backward",
        "c51_loss_and_grad", "c51_project", "c51_support", "checkpoint_from_bytes",
        "checkpoint_to_bytes", "clip_grad_norm", "expected_q", "forward", "init_params",
        "layout_fingerprint", "param_shapes", "q_probs", "read_checkpoint", "ret_probs",
        "return_bin_centres", "return_bin_of", "return_loss_and_grad", "return_moments",
        "sha256_hex", "to_numpy", "write_checkpoint",
    }  # fmt: skip
