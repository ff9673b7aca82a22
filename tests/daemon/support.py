"""What the daemon tests share: a short synthetic feed, a promoted model, a config file, and a
real ``tradeagent run`` subprocess driven through its control socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from agent.bench.daemon import trading_checkpoint
from agent.config import Config, load_config
from agent.control.client import ControlClient
from agent.control.endpoints import control_endpoint
from agent.control.errors import ControlUnreachable
from agent.model.config import ModelConfig
from feeds.config import InstrumentSpec, SynthConfig
from feeds.synth import write_synthetic
from storage import CheckpointStore, ModelRegistry, open_database
from storage.values import instrument_set_key

__all__ = [
    "INSTRUMENTS",
    "DaemonProcess",
    "config_text",
    "install_model",
    "model_checkpoint",
    "synth_feed",
]

# Five-minute sessions keep the feeds small (~1,800 records per instrument).
INSTRUMENTS = (
    InstrumentSpec(symbol="ES", instrument_id=1001, tick_size=0.25, tick_value=12.5, session_end="13:35"),
    InstrumentSpec(symbol="NQ", instrument_id=1002, tick_size=0.25, tick_value=5.0, session_end="13:35"),
)
TINY = ModelConfig(window=4, d_model=16, n_layers=1, headdim=8, d_state=8, n_atoms=21, return_bins=11)


def synth_feed(out: Path, *, seed: int = 7, days: int = 1) -> list[Path]:
    """Daily synthetic ``.dbn.zst`` files of :data:`INSTRUMENTS` (planted signal)."""
    return write_synthetic(out, instruments=INSTRUMENTS, synth=SynthConfig(days=days, signal=0.5), seed=seed)


def model_checkpoint(seed: int = 0, *, d_model: int = TINY.d_model) -> tuple[bytes, str]:
    """A tiny untrained network that trades, as checkpoint bytes, and its layout fingerprint."""
    return trading_checkpoint(msgspec.structs.replace(TINY, d_model=d_model), seed=seed)


def install_model(config: Config, blob: bytes, fingerprint: str, *, promote: bool = True) -> str:
    """Store, register and (by default) promote a checkpoint for the config's instruments."""
    database = open_database(config.storage, config.data_dir)
    try:
        sha = CheckpointStore.for_data_dir(config.data_dir).put(blob)
        registry = ModelRegistry(database)
        registry.register_candidate(
            sha256=sha,
            instrument_set=instrument_set_key([s.symbol for s in config.feeds.instruments]),
            layout_fingerprint=fingerprint,
            path=str(CheckpointStore.for_data_dir(config.data_dir).path(sha)),
            metrics={},
        )
        if promote:
            registry.promote(sha, by="test")
        return sha
    finally:
        database.close()


def config_text(data_dir: Path, source: str, *, extra: str = "", storage_url: str = "") -> str:
    """A daemon configuration: tiny model, paper broker, no metrics port, no schedule; the
    source's dataset is the synthetic feeds' (``SYNTH``) unless ``source`` sets one."""
    dataset = "" if "dataset" in source else f'dataset = "{SynthConfig().dataset}"\n'
    instruments = "".join(
        f"""
[[feeds.instruments]]
symbol = "{s.symbol}"
instrument_id = {s.instrument_id}
tick_size = {s.tick_size}
tick_value = {s.tick_value}
session_end = "{s.session_end}"
"""
        for s in INSTRUMENTS
    )
    storage = f'\n[storage]\nurl = "{storage_url}"\n' if storage_url else ""
    return f"""
data_dir = "{data_dir}"
device = "cpu"

[feeds.source]
{dataset}{source}

[model]
window = {TINY.window}
d_model = {TINY.d_model}
n_layers = {TINY.n_layers}
headdim = {TINY.headdim}
d_state = {TINY.d_state}
n_atoms = {TINY.n_atoms}
return_bins = {TINY.return_bins}

[policy]
max_contracts = 3

[daemon]
stop_timeout_s = 10.0
status_interval_s = 0.2
stale_decision_ms = 60000.0

[control]
metrics_port = 0

[schedule]
enabled = false
{storage}{extra}{instruments}"""


def write_config(path: Path, text: str) -> Config:
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={})


class DaemonProcess:
    """``python -m agent.cli --config FILE run`` as a real subprocess (``module``: a module that
    runs the CLI in a prepared process instead, e.g. ``tests.support.sqlite_full``). ``env``
    (added to this process's environment) reaches the daemon and :attr:`config`, which is the
    configuration the daemon runs with (its control socket is where this one talks to it)."""

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        module: str = "agent.cli",
    ) -> None:
        self.config_path = config_path
        self.module = module
        self._env = {**os.environ, **(env or {})}
        self.config = load_config(config_path, env=self._env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = ControlClient(
            control_endpoint(self.config.control, self.config.data_dir), timeout_s=5.0
        )

    def start(self, timeout: float = 60.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "--config", str(self.config_path), "run"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        self.wait_until(lambda s: s["state"] == "running", timeout)

    def status(self) -> dict[str, Any]:
        return self.client.request("status")

    def wait_until(self, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                last = self.status()
                if predicate(last):
                    return last
            except ControlUnreachable:
                pass
            time.sleep(0.1)
        raise AssertionError(
            f"condition not reached within {timeout} s; last status {last}\n{self.log_tail()}"
        )

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "<no log>"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
