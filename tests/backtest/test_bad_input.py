"""Bad input ends with a clear error, exit code 2, and nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.cli import main
from agent.model.checkpoint import checkpoint_to_bytes
from agent.model.params import init_params
from tests.daemon.support import TINY


def _backtest(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, str]:
    out = tmp_path / "out"
    code = main(["backtest", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert not out.exists(), "nothing may be written when the input is bad"
    return code, err


def test_missing_data_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, checkpoint_file: Path
) -> None:
    code, err = _backtest(
        capsys, tmp_path, "--data", str(tmp_path / "nope"), "--checkpoint", str(checkpoint_file)
    )
    assert code == 2
    assert "no such file or directory" in err


def test_empty_data_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, checkpoint_file: Path
) -> None:
    (tmp_path / "empty").mkdir()
    code, err = _backtest(
        capsys, tmp_path, "--data", str(tmp_path / "empty"), "--checkpoint", str(checkpoint_file)
    )
    assert code == 2
    assert "no .dbn or .dbn.zst files" in err


def test_dates_outside_the_data(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, signal_data: Path, checkpoint_file: Path
) -> None:
    code, err = _backtest(
        capsys,
        tmp_path,
        "--data",
        str(signal_data),
        "--checkpoint",
        str(checkpoint_file),
        "--from",
        "2030-01-01",
    )
    assert code == 2
    assert "no data between 2030-01-01" in err and "covers 2024-01-02 .. 2024-01-03" in err
    code, err = _backtest(capsys, tmp_path, "--data", str(signal_data), "--from", "2024-13-01")
    assert code == 2 and "expected a date" in err


def test_checkpoint_that_does_not_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, signal_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRADEAGENT_DATA_DIR", str(tmp_path / "state"))
    code, err = _backtest(capsys, tmp_path, "--data", str(signal_data), "--checkpoint", "deadbeefdeadbeef")
    assert code == 2 and "no checkpoint" in err
    code, err = _backtest(
        capsys, tmp_path, "--data", str(signal_data), "--checkpoint", str(tmp_path / "x.st")
    )
    assert code == 2 and "no such file" in err
    code, err = _backtest(capsys, tmp_path, "--data", str(signal_data), "--checkpoint", "promoted")
    assert code == 2 and "no promoted checkpoint" in err
    assert not (tmp_path / "state").exists(), "a backtest never creates a database"


def test_checkpoint_that_does_not_match_the_features(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, signal_data: Path
) -> None:
    cfg = TINY.with_features(5)
    blob = checkpoint_to_bytes(
        init_params(cfg, np.random.default_rng(0)),
        cfg,
        feature_names=("a", "b", "c", "agent_position", "agent_unrealised"),
        norm_mean=np.zeros(5, np.float32),
        norm_std=np.ones(5, np.float32),
    )
    path = tmp_path / "other.safetensors"
    path.write_bytes(blob)
    code, err = _backtest(capsys, tmp_path, "--data", str(signal_data), "--checkpoint", str(path))
    assert code == 2 and "do not match" in err
    path.write_bytes(blob[:100])
    code, err = _backtest(capsys, tmp_path, "--data", str(signal_data), "--checkpoint", str(path))
    assert code == 2 and "not a valid checkpoint" in err
