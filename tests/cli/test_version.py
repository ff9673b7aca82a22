"""The version has one source, pyproject.toml, read back from the installed metadata."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import agent

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_package_version_is_pyprojects() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert agent.__version__ == version("tradeagent") == declared


def test_the_cli_prints_it() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"tradeagent {agent.__version__}\n"
