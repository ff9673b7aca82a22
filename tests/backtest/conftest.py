"""Fixtures of the backtest tests: short synthetic days (five-minute sessions) and a small
checkpoint, made once per module."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from agent.config import Config, load_config
from feeds.config import SynthConfig
from feeds.synth import write_synthetic
from tests.daemon.support import INSTRUMENTS, model_checkpoint


def backtest_config(data_dir: Path, **risk: float) -> Config:
    """Embedded defaults on the test instruments, CPU, zero broker latency, loose risk limits
    unless given (the vectorised driver, which has no order-rate or loss halt, refuses a run in
    which one would act)."""
    base = load_config(env={})
    return msgspec.structs.replace(
        base,
        device="cpu",
        data_dir=str(data_dir),
        feeds=msgspec.structs.replace(base.feeds, instruments=INSTRUMENTS),
        broker=msgspec.structs.replace(base.broker, latency_ms=0.0),
        risk=msgspec.structs.replace(
            base.risk,
            max_orders_per_minute=int(risk.get("max_orders_per_minute", 1_000_000)),
            max_daily_loss=risk.get("max_daily_loss", 1e12),
            max_drawdown=risk.get("max_drawdown", 1e12),
        ),
    )


def synth_days(out: Path, *, signal: float, days: int, seed: int) -> Path:
    write_synthetic(out, instruments=INSTRUMENTS, synth=SynthConfig(days=days, signal=signal), seed=seed)
    return out


@pytest.fixture(scope="module")
def signal_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_days(tmp_path_factory.mktemp("signal"), signal=0.5, days=2, seed=11)


@pytest.fixture(scope="module")
def checkpoint_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    blob, _ = model_checkpoint(seed=3)
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    path.write_bytes(blob)
    return path
