from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_embedded_defaults_load_without_a_file() -> None:
    config = load_config(None, env={})
    assert config.device == "auto"
    assert config.feeds.bars.clock == "time"


@pytest.mark.parametrize("profile", sorted((REPO / "config").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_profile_loads(profile: Path) -> None:
    load_config(profile, env={})


def test_defaults_file_matches_the_code_defaults() -> None:
    assert load_config(REPO / "config" / "defaults.toml", env={"TRADEAGENT_DATA_DIR": "x"}) == load_config(
        None, env={"TRADEAGENT_DATA_DIR": "x"}
    )


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[feeds.bars]\nintervl_s = 2\n")
    with pytest.raises(ConfigError, match=r"c\.toml: key 'feeds\.bars\.intervl_s'"):
        load_config(path, env={})


def test_mistyped_value_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[feeds.bars]\ninterval_s = "2"\n')
    with pytest.raises(ConfigError, match=r"c\.toml: key 'feeds\.bars\.interval_s': Expected `float`"):
        load_config(path, env={})


def test_bad_value_in_a_list_names_the_index(tmp_path: Path) -> None:
    path = write(tmp_path, '[[feeds.instruments]]\nsymbol = "ES"\ninstrument_id = 1\ntick = 2\n')
    with pytest.raises(ConfigError, match=r"key 'feeds\.instruments\[0\]\.tick'"):
        load_config(path, env={})


def test_environment_overrides_win_and_are_typed(tmp_path: Path) -> None:
    path = write(tmp_path, "[feeds.bars]\ninterval_s = 2.0\n")
    config = load_config(
        path, env={"TRADEAGENT__FEEDS__BARS__INTERVAL_S": "5", "TRADEAGENT_DB_URL": "sqlite:///x.db"}
    )
    assert config.feeds.bars.interval_s == 5.0
    assert config.storage.url == "sqlite:///x.db"


def test_bad_environment_override_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="environment variable TRADEAGENT__FEEDS__BARS__INTERVAL_S"):
        load_config(None, env={"TRADEAGENT__FEEDS__BARS__INTERVAL_S": "fast"})


def test_unknown_environment_override_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"key 'feeds\.nope'"):
        load_config(None, env={"TRADEAGENT__FEEDS__NOPE": "1"})


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[feeds\n"), env={})


def test_spill_dir_must_be_an_absolute_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"key 'daemon\.spill_dir': 'spill' is not an absolute path"):
        load_config(write(tmp_path, '[daemon]\nspill_dir = "spill"\n'), env={})
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"key 'daemon\.spill_dir': .*a-file exists and is not a directory"):
        load_config(None, env={"TRADEAGENT__DAEMON__SPILL_DIR": str(tmp_path / "a-file")})
    assert load_config(None, env={"TRADEAGENT__DAEMON__SPILL_DIR": str(tmp_path)}).daemon.spill_dir == str(
        tmp_path
    )
