"""Bar interval and retrain schedule are validated when the configuration loads, with errors
that name the file (or variable) and the key, like every other configuration error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import main
from agent.config import ConfigError, load_config
from agent.daemon.config import ScheduleConfig


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[feeds.bars]\ninterval_s = -1.0\n", "feeds.bars.interval_s", "Expected `float` > 0.0"),
        ("[feeds.bars]\ninterval_s = 0\n", "feeds.bars.interval_s", "Expected `float` > 0.0"),
        ("[feeds.bars]\nevents = 0\n", "feeds.bars.events", "Expected `int` >= 1"),
        ('[schedule]\ncron = "61 2 * * *"\n', "schedule.cron", "'61 2 * * *' is not a crontab expression"),
        ('[schedule]\ncron = "30 2 * *"\n', "schedule.cron", "Wrong number of fields"),
        ('[schedule]\ncron = "30 2 31 2 *"\n', "schedule.cron", "'30 2 31 2 *' never fires"),
        ('[schedule]\ntimezone = "Mars/Olympus"\n', "schedule.timezone", "unknown time zone 'Mars/Olympus'"),
    ],
    ids=[
        "negative-interval",
        "zero-interval",
        "zero-events",
        "cron-range",
        "cron-fields",
        "cron-never",
        "tz",
    ],
)
def test_a_bad_value_names_the_file_and_the_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    message = str(caught.value)
    assert message.startswith(f"{path}: key '{key}': ")
    assert reason in message


def test_an_environment_override_is_named_instead_of_the_file() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={"TRADEAGENT__SCHEDULE__CRON": "*/0 * * * *"})
    assert str(caught.value).startswith(
        "environment variable TRADEAGENT__SCHEDULE__CRON: key 'schedule.cron': "
    )
    with pytest.raises(
        ConfigError, match=r"TRADEAGENT__FEEDS__BARS__INTERVAL_S: key 'feeds\.bars\.interval_s'"
    ):
        load_config(None, env={"TRADEAGENT__FEEDS__BARS__INTERVAL_S": "-5"})


def test_the_schedule_builds_the_trigger_it_validated() -> None:
    trigger = ScheduleConfig(cron="15 3 * * 1-5", timezone="Europe/London").trigger()
    assert str(trigger.timezone) == "Europe/London"
    assert {f.name: str(f) for f in trigger.fields}["day_of_week"] == "1-5"


def test_every_command_stops_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "[feeds.bars]\ninterval_s = -1.0\n")
    assert main(["--config", str(path), "synth", "--out", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"tradeagent synth: error: {path}: key 'feeds.bars.interval_s': Expected `float` > 0.0"
    )
    assert not (tmp_path / "data").exists()


def test_the_daemon_refuses_a_bad_cron_before_binding_anything(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    path = _write(tmp_path, f'data_dir = "{data_dir}"\n[schedule]\ncron = "30 25 * * *"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "--config", str(path), "run"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{path}: key 'schedule.cron': '30 25 * * *' is not a crontab expression" in proc.stderr
    assert "Traceback" not in proc.stderr
    # nothing was started: the control socket, the database and the lock live under data_dir
    assert not data_dir.exists()
