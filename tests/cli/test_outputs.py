"""Output paths are checked before any work, by every command that writes files.

The unwritable paths are ones that stop root too (tests may run as root, which ignores
permission bits): a path through a regular file, a directory where a file must be, a file where
a directory must be. Each refused case runs ``tradeagent`` as a real subprocess (its exit code
and the one line on its stderr are what a user sees) and checks that nothing happened: no
database, no data files, no summary.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import main
from feeds.config import InstrumentSpec, SynthConfig
from feeds.synth import write_synthetic
from tests.support.cli import refusal

ES = InstrumentSpec(symbol="ES", instrument_id=1001, session_end="13:40")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short synthetic day of ES: valid input, so only the output path can stop a command."""
    out = tmp_path_factory.mktemp("archive")
    write_synthetic(out, instruments=[ES], synth=SynthConfig(days=1), seed=3)
    return out


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


def _error(argv: list[str], data_dir: Path) -> str:
    """``tradeagent ARGV`` in a subprocess with ``data_dir``: it must exit 2 with one line on
    stderr, which is returned."""
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", *argv],
        env={**os.environ, "TRADEAGENT_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    err = refusal(result)
    assert result.stdout == ""
    return err


@pytest.mark.parametrize(
    "case",
    [
        (["synth", "--days", "1"], "--out"),
        (["backtest", "--data", "{archive}"], "--out"),
        (["train", "--data", "{archive}"], "--summary"),
        (["train", "--data", "{archive}"], "--report"),
        (["record"], "--out"),
        (["demo", "--quick"], "--out"),
    ],
    ids=["synth", "backtest", "train-summary", "train-report", "record", "demo"],
)
def test_a_path_through_a_file_stops_the_command_before_any_work(
    case: tuple[list[str], str], archive: Path, data_dir: Path, tmp_path: Path
) -> None:
    command, option = case
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    target = blocker / "sub" / ("out.json" if option != "--out" else "dir")
    argv = [part.format(archive=archive) for part in command] + [option, str(target)]
    err = _error(argv, data_dir)
    assert f"{option} {target}: cannot create the directory" in err
    assert f"{blocker} is a file" in err and "choose another path" in err
    assert not data_dir.exists()  # no database, no checkpoint store, no report: nothing ran
    assert blocker.read_text() == "not a directory"


def test_the_wrong_kind_of_path_is_named(archive: Path, data_dir: Path, tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    err = _error(["synth", "--days", "1", "--out", str(a_file)], data_dir)
    assert err.endswith(f"--out {a_file}: is a file, not a directory; choose a directory")
    err = _error(["train", "--data", str(archive), "--report", str(tmp_path)], data_dir)
    assert err.endswith(f"--report {tmp_path}: is a directory; give a file name")
    assert not data_dir.exists()


def test_the_defaulted_checkpoint_store_is_checked_too(archive: Path, tmp_path: Path) -> None:
    """train writes the checkpoint store at its very end: a data_dir that cannot hold one (a
    regular file here) is refused before anything runs."""
    blocker = tmp_path / "state-file"
    blocker.write_text("x")
    summary, report = tmp_path / "s.json", tmp_path / "r.html"
    argv = ["train", "--data", str(archive), "--summary", str(summary), "--report", str(report)]
    err = _error(argv, blocker)
    assert err.startswith(f"tradeagent train: error: data_dir (checkpoint store) {blocker / 'checkpoints'}:")
    assert not summary.exists() and not report.exists()


def test_a_writable_output_is_left_as_the_command_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "data"
    assert main(["synth", "--days", "1", "--instruments", "ES", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names and all(name.endswith(".dbn.zst") for name in names)  # no probe file left behind
    assert capsys.readouterr().out.split() == [str(out / name) for name in names]
