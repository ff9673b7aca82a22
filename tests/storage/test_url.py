from __future__ import annotations

from pathlib import Path

import pytest

from storage import StorageConfig
from storage.errors import InvalidDatabaseURL
from storage.url import display_url, is_embedded, mask_secrets, parse_url, resolve_url


def test_empty_url_is_the_embedded_file_under_the_data_dir(tmp_path: Path) -> None:
    url = resolve_url(StorageConfig(), tmp_path)
    assert url.drivername == "sqlite+pysqlite"
    assert url.database == str(tmp_path.resolve() / "tradeagent.db")
    assert is_embedded(StorageConfig())
    assert not is_embedded(StorageConfig(url="sqlite:////x.db"))


@pytest.mark.parametrize(
    ("text", "driver"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h:5433/db", "postgresql+psycopg"),
        ("sqlite:////var/lib/x.db", "sqlite+pysqlite"),
    ],
)
def test_supported_urls_select_their_driver(text: str, driver: str) -> None:
    assert parse_url(text).drivername == driver


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not a url", "malformed database URL"),
        ("://u:hunter2@", "malformed database URL"),
        ("mysql://u:hunter2@h/db", "unsupported dialect 'mysql'"),
        ("postgresql+psycopg2://u:hunter2@h/db", "unsupported driver 'psycopg2'"),
        ("sqlite://", "SQLite needs a file path"),
        ("sqlite:///:memory:", "SQLite needs a file path"),
        ("postgresql://u:hunter2@h", "no database name"),
    ],
)
def test_bad_urls_are_refused_clearly_without_the_password(text: str, message: str) -> None:
    with pytest.raises(InvalidDatabaseURL, match=message) as info:
        parse_url(text)
    assert "hunter2" not in str(info.value)


def test_display_and_mask_hide_passwords() -> None:
    assert display_url(parse_url("postgresql://u:s3cret@h/db")) == "postgresql+psycopg://u:***@h/db"
    assert mask_secrets("see postgresql://u:p@ss@h/db now") == "see postgresql://u:***@h/db now"
    assert mask_secrets("sqlite:////a/b.db") == "sqlite:////a/b.db"
