"""Acceptance tests of the trainer (issue 5), on the CPU with config/tiny.toml.

Data: three trading days of ES from the project's synthetic generator (real DBN files) with its
default planted signal (``signal = 0.5``), and the same days with ``signal = 0`` (a martingale
mid: the same random draws, only the move directions differ).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.config import load_config
from agent.train.floors import VOL_REF_FLOOR
from feeds.config import SynthConfig
from feeds.synth import write_synthetic
from storage import CheckpointStore, LearnedFloors, ModelRegistry, open_database
from storage.config import StorageConfig
from tests.conftest import REPO

pytestmark = pytest.mark.slow

TINY = str(REPO / "config" / "tiny.toml")
ES_ID = 1001


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    config = load_config(None, env={})
    es = [s for s in config.feeds.instruments if s.symbol == "ES"]
    out = {}
    for name, strength in (("signal", 0.5), ("martingale", 0.0)):
        path = tmp_path_factory.mktemp(name)
        write_synthetic(path, instruments=es, synth=SynthConfig(days=3, signal=strength), seed=11)
        out[name] = path
    return out


def _train(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path, data: Path, *extra: str
) -> tuple[int, dict[str, Any]]:
    monkeypatch.setenv("TRADEAGENT_DATA_DIR", str(data_dir))
    summary = data_dir / "summary.json"
    code = main(
        [
            "--config",
            TINY,
            "train",
            "--data",
            str(data),
            "--instruments",
            "ES",
            "--summary",
            str(summary),
            "--report",
            str(data_dir / "report.html"),
            *extra,
        ]
    )
    return code, json.loads(summary.read_text())


def _state(data_dir: Path) -> dict[str, Any]:
    """Everything a failed run must leave untouched: registry rows, promoted model, floors, files."""
    with open_database(StorageConfig(), data_dir) as db:
        registry = ModelRegistry(db)
        promoted = registry.current_promoted("ES")
        return {
            "promoted": promoted.sha256 if promoted else None,
            "checkpoints": sorted((c.sha256, c.status) for c in registry.checkpoints()),
            "floor": LearnedFloors(db).history(ES_ID, VOL_REF_FLOOR),
            "files": CheckpointStore.for_data_dir(data_dir).hashes(),
        }


@pytest.fixture(scope="module")
def promoted(
    archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """One run on the planted-signal archive with --promote (the incumbent of later tests)."""
    data_dir = tmp_path_factory.mktemp("promoted")
    with pytest.MonkeyPatch.context() as mp:
        code, summary = _train(mp, data_dir, archives["signal"], "--promote", "--seed", "0")
    assert code == 0
    yield data_dir, summary


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_it_learns_and_is_promoted(promoted: tuple[Path, dict[str, Any]]) -> None:
    data_dir, summary = promoted
    folds = summary["folds"]
    beats = [f["sharpe"] > 0 and f["sharpe"] > f["baselines"]["random"] for f in folds]
    assert sum(beats) > len(folds) / 2, folds
    assert summary["oos"]["sharpe"] > 0 and summary["oos"]["pnl"] > 0
    assert summary["promoted"] and not summary["halted"] and summary["halt_reason"] is None
    state = _state(data_dir)
    assert state["promoted"] == summary["candidate_sha256"]
    assert [c[1] for c in state["checkpoints"]] == ["promoted"]
    # Floors learned from the training data and stored with history; the report is self-contained.
    assert len(state["floor"]) == 1 and state["floor"][0].value == pytest.approx(
        summary["floors"]["ES"]["value"]
    )
    html = (data_dir / "report.html").read_text()
    assert (
        html.count("<svg") >= 5
        and "http://" not in html.replace("http://www.w3.org", "")
        and "<script" not in html
    )
    with open_database(StorageConfig(), data_dir) as db:
        kinds = {g.kind for g in ModelRegistry(db).gate_events(summary["run_id"])}
    assert {
        "q_drift",
        "kill_q_spread",
        "kill_action_entropy",
        "kill_return_vs_random",
        "kill_early_q_move",
        "promotion",
    } <= kinds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_it_does_not_fool_itself_on_a_martingale(
    archives: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    code, summary = _train(monkeypatch, tmp_path, archives["martingale"], "--promote", "--seed", str(seed))
    assert code == 0
    assert not summary["promoted"] and summary["candidate_status"] == "rejected"
    assert _state(tmp_path)["promoted"] is None


def test_incumbent_is_re_evaluated_on_the_same_folds(
    promoted: tuple[Path, dict[str, Any]],
    archives: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir = _copy(promoted[0], tmp_path / "dd")
    incumbent = promoted[1]
    code, summary = _train(monkeypatch, data_dir, archives["signal"], "--promote", "--seed", "5")
    assert code == 0 and summary["incumbent_sha256"] == incumbent["candidate_sha256"]
    # The incumbent is the original run's last-fold model: on that fold (same bars, same
    # normalisation) it scores exactly what it scored when it was trained.
    assert summary["folds"][-1]["incumbent_sharpe"] == pytest.approx(incumbent["folds"][-1]["sharpe"])
    assert all(f["incumbent_sharpe"] is not None for f in summary["folds"])
    margin = load_config(TINY, env={}).train.promotion_margin
    should = summary["oos"]["sharpe"] > summary["incumbent_sharpe"] + margin
    assert summary["promoted"] is should
    assert (_state(data_dir)["promoted"] == summary["candidate_sha256"]) is should


def test_q_drift_halt_rejects_and_keeps_the_incumbent(
    promoted: tuple[Path, dict[str, Any]],
    archives: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir = _copy(promoted[0], tmp_path / "dd")
    before = _state(data_dir)
    monkeypatch.setenv("TRADEAGENT__TRAIN__LR", "0.5")  # a huge learning rate ...
    monkeypatch.setenv("TRADEAGENT__TRAIN__TARGET_UPDATE", "none")  # ... and no target network
    monkeypatch.setenv("TRADEAGENT__TRAIN__GRAD_CLIP", "1e9")
    code, summary = _train(monkeypatch, data_dir, archives["signal"], "--promote")
    assert code == 0 and summary["halted"] and not summary["promoted"]
    assert "Q is diverging" in summary["halt_reason"] or "NaN" in summary["halt_reason"]
    after = _state(data_dir)
    assert after["promoted"] == before["promoted"]
    assert after["floor"] == before["floor"] or len(after["floor"]) == len(before["floor"]) + 1
    if summary["candidate_sha256"]:  # finite weights are kept as a rejected candidate, with the reason
        assert (summary["candidate_sha256"], "rejected") in after["checkpoints"]
    with open_database(StorageConfig(), data_dir) as db:
        events = ModelRegistry(db).gate_events(summary["run_id"])
    halt = [e for e in events if e.kind == "q_drift" and not e.passed]
    assert len(halt) == 1
    values = halt[0].values
    assert (
        values["drift_abs"] == 1.5 and values["drift_ratio"] == 2.0 and "q" in values and "q_prev" in values
    )
    assert halt[0].fold_index == 0 and halt[0].epoch is not None


def test_timeout_ends_cleanly_and_registers_nothing(
    promoted: tuple[Path, dict[str, Any]],
    archives: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir = _copy(promoted[0], tmp_path / "dd")
    before = _state(data_dir)
    code, summary = _train(monkeypatch, data_dir, archives["signal"], "--promote", "--max-minutes", "0.05")
    assert code == 3
    assert summary["timed_out"] and not summary["promoted"] and summary["candidate_sha256"] is None
    assert _state(data_dir) == before
    with open_database(StorageConfig(), data_dir) as db:
        assert ModelRegistry(db).gate_events(promoted[1]["run_id"] + 1) == []


def test_killed_training_process_leaves_everything_untouched(
    promoted: tuple[Path, dict[str, Any]], archives: dict[str, Path], tmp_path: Path
) -> None:
    data_dir = _copy(promoted[0], tmp_path / "dd")
    before = _state(data_dir)
    env = {**os.environ, "TRADEAGENT_DATA_DIR": str(data_dir)}
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "--config",
            TINY,
            "train",
            "--data",
            str(archives["signal"]),
            "--instruments",
            "ES",
            "--promote",
            "--summary",
            str(tmp_path / "s.json"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            if "fold 0: training on" in line:
                break
            assert time.monotonic() < deadline, "training never started"
        time.sleep(1.0)  # well inside fold 0
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert _state(data_dir) == before
    assert not (tmp_path / "s.json").exists()
