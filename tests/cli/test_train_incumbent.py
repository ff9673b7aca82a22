"""A promoted checkpoint that cannot be loaded is found before any training, with the commands
that fix it (``tradeagent train`` run as a real process); ``train --promote --no-incumbent``
trains on and promotes over it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import main
from agent.config import load_config
from feeds.config import SynthConfig
from feeds.synth import write_synthetic
from storage import CheckpointStore, ModelRegistry, open_database
from storage.config import StorageConfig
from tests.conftest import REPO
from tests.daemon.support import install_model, model_checkpoint
from tests.support.cli import refusal

pytestmark = pytest.mark.slow

ES_HOUR = """
[[feeds.instruments]]
symbol = "ES"
instrument_id = 1001
tick_size = 0.25
tick_value = 12.5
session_start = "13:30"
session_end = "14:30"
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config/tiny.toml trading ES alone in one-hour sessions (as the trainer's acceptance tests)."""
    path = tmp_path_factory.mktemp("config") / "tiny-es.toml"
    path.write_text((REPO / "config" / "tiny.toml").read_text() + ES_HOUR)
    return path


@pytest.fixture(scope="module")
def archive(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four days with a strong planted signal: what the acceptance tests promote from."""
    path = tmp_path_factory.mktemp("signal")
    es = list(load_config(tiny, env={}).feeds.instruments)
    write_synthetic(path, instruments=es, synth=SynthConfig(days=4, signal=1.0), seed=11)
    return path


@pytest.fixture
def corrupt(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, bytes]:
    """A data_dir whose promoted ES checkpoint has one byte flipped in the store."""
    data_dir = tmp_path / "state"
    monkeypatch.setenv("TRADEAGENT_DATA_DIR", str(data_dir))
    sha = install_model(load_config(tiny), *model_checkpoint())
    path = CheckpointStore.for_data_dir(data_dir).path(sha)
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    path.write_bytes(bytes(damaged))
    return data_dir, sha, bytes(damaged)


def _train_args(tiny: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(tiny),
        "train",
        "--data",
        str(data),
        "--instruments",
        "ES",
        "--promote",
        "--summary",
        str(out / "summary.json"),
        "--report",
        str(out / "report.html"),
        *extra,
    ]


def _train(tiny: Path, data: Path, out: Path, *extra: str) -> int:
    return main(_train_args(tiny, data, out, *extra))


def _runs_and_states(data_dir: Path) -> tuple[int, dict[str, str]]:
    with open_database(StorageConfig(), data_dir) as db:
        registry = ModelRegistry(db)
        return registry.count_runs("ES"), {c.sha256: c.status for c in registry.checkpoints()}


def test_a_corrupt_incumbent_stops_the_run_before_training_with_the_remedy(
    tiny: Path, corrupt: tuple[Path, str, bytes], tmp_path: Path
) -> None:
    data_dir, sha, damaged = corrupt
    # An archive without a single DBN file: any training would fail on it, so the incumbent's
    # error proves the incumbent was checked first. `tradeagent train` runs as a real process
    # (TRADEAGENT_DATA_DIR from the fixture): its exit code and stderr are what a user sees.
    empty = tmp_path / "no-days"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", *_train_args(tiny, empty, tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    err = refusal(result)
    assert err.startswith(
        f"tradeagent train: error: the promoted checkpoint {sha[:12]} of ES cannot be the incumbent:"
    )
    assert "is corrupt" in err and "Nothing was trained" in err
    assert f"`tradeagent --config {tiny} ctl rollback`" in err
    assert f"`tradeagent --config {tiny} ctl promote <sha256 of a candidate>`" in err
    assert (
        f"`tradeagent --config {tiny} train --data {empty} --instruments ES --promote --no-incumbent`" in err
    )
    assert not (tmp_path / "summary.json").exists()
    assert _runs_and_states(data_dir) == (0, {sha: "promoted"})
    assert CheckpointStore.for_data_dir(data_dir).path(sha).read_bytes() == damaged  # left for inspection


def test_no_incumbent_trains_and_promotes_over_the_broken_checkpoint(
    tiny: Path,
    archive: Path,
    corrupt: tuple[Path, str, bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir, broken, _ = corrupt
    assert _train(tiny, archive, tmp_path, "--seed", "0", "--no-incumbent") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["incumbent_sha256"] is None
    assert summary["incumbent_note"] == f"not compared (--no-incumbent): promoted {broken[:12]}"
    promotion = [g for g in summary["gates"] if g["kind"] == "promotion"][-1]
    assert promotion["values"]["incumbent"] is False
    # The planted signal is learned (as in the trainer's acceptance test with the same data and
    # seed): the candidate is promoted, and the broken checkpoint is retired.
    assert summary["promoted"], summary["gate"]
    runs, states = _runs_and_states(data_dir)
    assert runs == 1
    assert states == {broken: "retired", summary["candidate_sha256"]: "promoted"}
    # The new incumbent loads: the next run's check passes and fails only on its (empty) data.
    empty = tmp_path / "no-days"
    empty.mkdir()
    capsys.readouterr()
    assert _train(tiny, empty, tmp_path / "again") == 2
    assert capsys.readouterr().err.strip().endswith(f"{empty}: directory holds no .dbn or .dbn.zst files")
