"""``tradeagent bench train --json`` end to end on a small archive: one JSON object with every
documented key, the standard retrain run through ``train``'s walk-forward on the archive given
(its as-traded evaluation replays those files). The figures are measurements: only their sanity
is checked."""

from __future__ import annotations

from pathlib import Path

from agent.config import load_config
from agent.train.data import select_instruments
from feeds.config import SynthConfig
from feeds.synth import write_synthetic
from tests.support.bench import bench_json

KEYS = {
    "device",
    "bars",
    "load_s",
    "env_steps_per_s",
    "updates_per_s",
    "act_steps_per_s",
    "learner",
    "standard_retrain_s",
    "standard_retrain_extrapolated",
    "standard_retrain_train_s",
    "standard_retrain_measured_s",
    "standard_retrain_fraction",
}


def test_bench_train_prints_one_json_object_with_its_keys(tmp_path: Path) -> None:
    config = load_config(None)
    archive = tmp_path / "archive"
    write_synthetic(
        archive,
        instruments=select_instruments(config.feeds, ["ES"]),
        synth=SynthConfig(days=6, events_per_second=2.0),
        seed=3,
    )
    tiny = {"MODEL__WINDOW": "4", "MODEL__D_MODEL": "16", "MODEL__N_LAYERS": "1", "MODEL__HEADDIM": "8"}
    tiny |= {"TRAIN__EPOCHS": "1", "TRAIN__STEPS_PER_EPOCH": "50", "TRAIN__LEARNING_STARTS": "64"}
    tiny["FEEDS__BARS__INTERVAL_S"] = "10"  # ten times fewer bars than the default: a quick run
    env = {f"TRADEAGENT__{key}": value for key, value in tiny.items()}
    result = bench_json(
        "train", "--device", "cpu", "--data", str(archive), "--steps", "20", data_dir=tmp_path / "d", env=env
    )
    assert set(result) == KEYS
    assert result["learner"] == "array code (NumPy)" and result["bars"] > 0
    assert result["updates_per_s"] > 0 and result["act_steps_per_s"] > 0 and result["env_steps_per_s"] > 0
    assert result["standard_retrain_extrapolated"] is True and 0 < result["standard_retrain_fraction"] < 1
    assert result["standard_retrain_measured_s"] > result["standard_retrain_train_s"] > 0
