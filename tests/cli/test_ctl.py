"""``tradeagent ctl`` against a real daemon subprocess: its output through a pipe that closes
early, and ``promote`` by a hash prefix (resolved as ``backtest --checkpoint`` resolves one)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import EXIT_BROKEN_PIPE
from storage import CheckpointStore
from tests.daemon.support import (
    DaemonProcess,
    config_text,
    install_model,
    model_checkpoint,
    replay_source,
    synth_feed,
    write_config,
)

CLI = [sys.executable, "-m", "agent.cli"]


class Running:
    """A daemon trading a promoted model, with a second checkpoint registered as a candidate."""

    def __init__(self, config_path: Path, daemon: DaemonProcess, promoted: str, candidate: str) -> None:
        self.config_path = config_path
        self.daemon = daemon
        self.promoted = promoted
        self.candidate = candidate

    def ctl(self, *args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "--config", str(self.config_path), "ctl", *args],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("ctl")
    feed = tmp / "synth"
    synth_feed(feed)
    config_path = tmp / "daemon.toml"
    # Real-time replay of a five-minute session: the daemon keeps running through the module.
    config = write_config(config_path, config_text(tmp / "data", replay_source(feed, pace=1.0)))
    promoted = install_model(config, *model_checkpoint(seed=0))
    candidate = install_model(config, *model_checkpoint(seed=1), promote=False)
    with DaemonProcess(config_path, tmp / "daemon.log") as daemon:
        daemon.start()
        yield Running(config_path, daemon, promoted, candidate)
        assert daemon.terminate() == 0, daemon.log_tail()


def test_status_through_head_prints_its_first_line_and_no_traceback(running: Running) -> None:
    command = " ".join(shlex.quote(c) for c in [*CLI, "--config", str(running.config_path), "ctl", "status"])
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode in (0, EXIT_BROKEN_PIPE), proc.stderr
    assert proc.stdout.startswith("state") and len(proc.stdout.splitlines()) == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


@pytest.mark.parametrize("args", [("status",), ("status", "--json")], ids=["table", "json"])
def test_a_reader_gone_before_the_reply_ends_ctl_quietly(running: Running, args: tuple[str, ...]) -> None:
    """The pipe's read end is closed before the command starts: its first write fails, every
    time, which a reader like ``head`` only causes when it wins the race."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = running.ctl(*args, stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == EXIT_BROKEN_PIPE
    assert proc.stderr == ""


def test_promote_by_a_prefix_swaps_to_the_checkpoint_it_names(running: Running) -> None:
    assert running.daemon.status()["model"] == running.promoted
    proc = running.ctl("promote", running.candidate[:10].upper())
    assert proc.returncode == 0, proc.stderr
    assert f"serving   {running.candidate}" in proc.stdout
    assert running.daemon.status()["model"] == running.candidate


@pytest.fixture
def lone_store(tmp_path: Path) -> tuple[Path, CheckpointStore]:
    """A configuration whose store holds two checkpoints sharing nine hex digits (no daemon:
    a bad prefix is refused before the daemon would be asked)."""
    config_path = tmp_path / "c.toml"
    config = write_config(config_path, config_text(tmp_path / "data", 'kind = "replay"'))
    store = CheckpointStore.for_data_dir(config.data_dir)
    for sha in ("deadbeef0" + "1" * 55, "deadbeef0" + "2" * 55):
        store.path(sha).parent.mkdir(parents=True, exist_ok=True)
        store.path(sha).write_bytes(b"named, never read")
    return config_path, store


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (
            "deadbeef",
            "ambiguous, 2 checkpoints in {root} start with it; give enough digits to pick one: "
            "deadbeef01, deadbeef02",
        ),
        ("deadbeefdeadbeef", "no checkpoint in {root} starts with it"),
        ("dead", "not a sha256 or a prefix of one (8 to 64 hex digits)"),
    ],
    ids=["ambiguous", "unknown", "too-short"],
)
def test_a_prefix_that_names_no_single_checkpoint_is_refused(
    lone_store: tuple[Path, CheckpointStore], prefix: str, message: str
) -> None:
    config_path, store = lone_store
    proc = subprocess.run(
        [*CLI, "--config", str(config_path), "ctl", "promote", prefix],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    expected = f"tradeagent ctl: error: promote {prefix}: {message.format(root=store.root)}"
    assert proc.stderr.strip() == expected
