"""Checkpoint round trip and rejection of corrupt, mismatched or invalid checkpoints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import numpy as np
import pytest
import safetensors.numpy

from agent.model import (
    Adam,
    Array,
    CheckpointError,
    ModelConfig,
    ModelError,
    Params,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    forward,
    init_params,
    layout_fingerprint,
    param_shapes,
    read_checkpoint,
    sha256_hex,
    to_numpy,
    write_checkpoint,
)
from tests.model.conftest import TINY

FEATURES = ("ret_1", "spread", "position")


def _bytes(
    xp: ModuleType, *, with_optimizer: bool = True, cfg: ModelConfig = TINY
) -> tuple[bytes, Params, Adam]:
    params = init_params(cfg, np.random.default_rng(0), xp)
    opt = Adam(params, lr=1e-3, weight_decay=0.01)
    grads = {name: xp.ones_like(p) for name, p in params.items()}
    opt.update(params, grads)
    data = checkpoint_to_bytes(
        params,
        cfg,
        feature_names=FEATURES[: cfg.n_features],
        norm_mean=xp.asarray(np.arange(cfg.n_features, dtype=np.float32)),
        norm_std=xp.asarray(np.full(cfg.n_features, 2.0, dtype=np.float32)),
        optimizer=opt.state() if with_optimizer else None,
        metadata={"run_id": "r-42", "seed": 7, "instruments": ["ES", "NQ"]},
    )
    return data, params, opt


def test_round_trip_keeps_everything(xp: ModuleType) -> None:
    data, params, opt = _bytes(xp)
    ckpt = checkpoint_from_bytes(
        data, expected_sha256=sha256_hex(data), expected_fingerprint=layout_fingerprint(params)
    )
    assert ckpt.config == TINY
    assert ckpt.feature_names == FEATURES
    assert ckpt.metadata == {"run_id": "r-42", "seed": 7, "instruments": ["ES", "NQ"]}
    assert ckpt.sha256 == sha256_hex(data)
    np.testing.assert_array_equal(ckpt.norm_mean, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(ckpt.norm_std, [2.0, 2.0, 2.0])
    assert set(ckpt.params) == set(params)
    for name, value in params.items():
        np.testing.assert_array_equal(ckpt.params[name], to_numpy(value))
        assert ckpt.params[name].dtype == np.float32
    assert ckpt.optimizer is not None
    assert ckpt.optimizer.step == 1
    assert ckpt.optimizer.lr == 1e-3
    assert ckpt.optimizer.weight_decay == 0.01
    for name, value in opt.m.items():
        np.testing.assert_array_equal(ckpt.optimizer.m[name], to_numpy(value))
        np.testing.assert_array_equal(ckpt.optimizer.v[name], to_numpy(opt.v[name]))
    restored = {name: xp.asarray(a) for name, a in ckpt.params.items()}
    x = xp.asarray(
        np.random.default_rng(1).standard_normal((2, TINY.window, TINY.n_features)).astype(np.float32)
    )
    np.testing.assert_array_equal(
        to_numpy(forward(restored, TINY, x)[0]), to_numpy(forward(params, TINY, x)[0])
    )
    resumed = Adam.from_state(ckpt.optimizer, restored)
    assert resumed.step == 1


def test_without_optimizer_state(xp: ModuleType) -> None:
    data, _, _ = _bytes(xp, with_optimizer=False)
    assert checkpoint_from_bytes(data).optimizer is None


def test_serialisation_is_deterministic() -> None:
    assert _bytes(np)[0] == _bytes(np)[0]


def test_file_round_trip_is_atomic_and_content_addressed(tmp_path: Path) -> None:
    data, _, _ = _bytes(np)
    path = tmp_path / "models" / "candidate.safetensors"
    digest = write_checkpoint(path, data)
    assert digest == sha256_hex(data)
    assert os.listdir(path.parent) == ["candidate.safetensors"]  # no temporary file left behind
    assert read_checkpoint(path, expected_sha256=digest).sha256 == digest
    other, _, _ = _bytes(np, with_optimizer=False)
    write_checkpoint(path, other)  # replaces the file in one rename
    assert read_checkpoint(path).sha256 == sha256_hex(other)


def test_wrong_hash_is_rejected(tmp_path: Path) -> None:
    data, _, _ = _bytes(np)
    path = tmp_path / "c.safetensors"
    write_checkpoint(path, data)
    with pytest.raises(CheckpointError, match="sha256"):
        read_checkpoint(path, expected_sha256="0" * 64)
    assert path.read_bytes() == data  # a failed load changes nothing


def test_other_fingerprint_is_rejected() -> None:
    data, _, _ = _bytes(np)
    wider = layout_fingerprint(param_shapes(msgspec.structs.replace(TINY, d_model=16)))
    with pytest.raises(CheckpointError, match="differs from the expected layout"):
        checkpoint_from_bytes(data, expected_fingerprint=wider)


def test_corrupt_bytes_are_rejected() -> None:
    data, _, _ = _bytes(np)
    header = int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(5)
    corruptions = {
        "empty": b"",
        "truncated header": data[:6],
        "truncated body": data[: len(data) - 100],
        "garbage": bytes(rng.integers(0, 256, 4096, dtype=np.uint8)),
        "huge header length": (2**62).to_bytes(8, "little") + data[8:],
    }
    for offset in (3, 8 + header // 2, 8 + header + 5, len(data) - 1):  # size, header, tensor data
        flipped = bytearray(data)
        flipped[offset] ^= 0x10
        corruptions[f"bit flip at {offset}"] = bytes(flipped)
    for name, bad in corruptions.items():
        with pytest.raises(CheckpointError):
            checkpoint_from_bytes(bad)
            pytest.fail(f"{name}: accepted")


def test_a_safetensors_file_that_is_not_ours_is_rejected() -> None:
    tensors = {"w": np.zeros(3, dtype=np.float32)}
    with pytest.raises(CheckpointError, match="no tradeagent metadata"):
        checkpoint_from_bytes(safetensors.numpy.save(tensors, metadata={"format": "pt"}))
    future = json.dumps({"format": "tradeagent.checkpoint", "format_version": "2"})
    with pytest.raises(CheckpointError, match="unsupported checkpoint format"):
        checkpoint_from_bytes(safetensors.numpy.save(tensors, metadata={"tradeagent": future}))


def test_missing_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        read_checkpoint(tmp_path / "missing.safetensors")


def test_invalid_models_are_not_saved() -> None:
    params = init_params(TINY, np.random.default_rng(0))
    mean, std = np.zeros(3, dtype=np.float32), np.ones(3, dtype=np.float32)

    def save(
        p: Params = params,
        names: tuple[str, ...] = FEATURES,
        s: Array = std,
        meta: dict[str, Any] | None = None,
    ) -> bytes:
        return checkpoint_to_bytes(p, TINY, feature_names=names, norm_mean=mean, norm_std=s, metadata=meta)

    nan_params = {**params, "q.b": params["q.b"].copy()}
    nan_params["q.b"][0] = np.nan
    with pytest.raises(ModelError, match=r"q\.b holds NaN"):
        save(nan_params)
    with pytest.raises(ModelError, match=r"missing \['ret\.b'\]"):
        save({k: v for k, v in params.items() if k != "ret.b"})
    with pytest.raises(ModelError, match="norm/std must be > 0"):
        save(s=np.zeros(3, dtype=np.float32))
    with pytest.raises(ModelError, match="feature names"):
        save(names=("a",))
    with pytest.raises(ModelError, match="not plain JSON"):
        save(meta={"x": object()})
    assert checkpoint_from_bytes(save()).feature_names == FEATURES
