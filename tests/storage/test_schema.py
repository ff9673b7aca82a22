"""Migrations, opening rules, the ``tradeagent db`` commands and bad databases at start."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import storage
from agent.bench.scratch_db import scratch_database
from agent.cli import main
from storage import Instruments, StorageConfig, open_database
from storage.errors import (
    CorruptDatabase,
    DatabaseUnavailable,
    InvalidDatabaseURL,
    InvalidRecord,
    SchemaBehindHead,
)
from storage.schema import _alembic_config, current_revision, head_revision, history, upgrade
from storage.tables import Base
from storage.values import InstrumentInfo, instrument_set_key
from tests.conftest import skip_or_fail
from tests.storage.conftest import PG_URL, Target

REPO = Path(__file__).resolve().parents[2]


def tradeagent(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (exit codes as a shell sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., Ran]]:
    """Run ``tradeagent`` in this process (faster than a subprocess); restores logging after."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)

    def run(*args: str, env: dict[str, str]) -> Ran:
        for name in ("TRADEAGENT_DB_URL", "TRADEAGENT_DATA_DIR"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code = main(list(args))
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    yield run
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def test_migrations_produce_exactly_the_models(target: Target) -> None:
    with target.open() as db:
        with db.connection(read_only=True) as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
        assert current_revision(db) == head_revision()


def test_history_lists_the_shipped_head() -> None:
    revisions = history()
    assert revisions[0].is_head and revisions[0].revision == head_revision()
    assert revisions[-1].down_revision is None


def test_embedded_sqlite_is_created_and_migrated_on_first_use(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / "dir"
    with open_database(StorageConfig(), data_dir) as db:
        assert current_revision(db) == head_revision()
        assert db.sqlite_path == (data_dir / "tradeagent.db").resolve()
        mode = db.read(lambda s: s.connection().exec_driver_sql("PRAGMA journal_mode").scalar(), what="t")
        sync = db.read(lambda s: s.connection().exec_driver_sql("PRAGMA synchronous").scalar(), what="t")
        assert (mode, sync) == ("wal", 2)  # 2 = FULL
    with open_database(StorageConfig(), data_dir) as db:  # second start: nothing to do
        assert current_revision(db) == head_revision()


def test_a_new_embedded_ledger_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    previous = os.umask(0o022)
    try:
        for data_dir in (tmp_path / "new" / "data", existing):
            with open_database(StorageConfig(), data_dir) as db:
                Instruments(db).upsert(
                    [InstrumentInfo(instrument_id=1, symbol="ES", tick_size=0.25, tick_value=12.5)]
                )
                modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in data_dir.iterdir()}
            assert modes == {"tradeagent.db": 0o600, "tradeagent.db-wal": 0o600, "tradeagent.db-shm": 0o600}
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new" / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755  # an existing directory is left as it is


def test_an_explicit_url_behind_head_refuses_to_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'explicit.db'}"
    with pytest.raises(SchemaBehindHead, match="tradeagent db upgrade"):
        open_database(StorageConfig(url=url), tmp_path)
    with open_database(StorageConfig(url=url), tmp_path, check_schema=False) as db:
        assert upgrade(db) == (None, head_revision())
        assert upgrade(db) == (head_revision(), head_revision())
    open_database(StorageConfig(url=url), tmp_path).close()


def test_postgres_behind_head_names_the_fix_and_cli_upgrades_it(
    pg_template: tuple[str | None, str], cli: Callable[..., Ran]
) -> None:
    if pg_template[0] is None:
        skip_or_fail(f"PostgreSQL at TRADEAGENT_TEST_PG_URL is not usable: {pg_template[1]}")
    with scratch_database(PG_URL, prefix="tradeagent_test") as url:
        text = url.render_as_string(hide_password=False)
        with pytest.raises(SchemaBehindHead, match=r"run `tradeagent db upgrade`"):
            open_database(StorageConfig(url=text), ".")
        env = {"TRADEAGENT_DB_URL": text}
        before = cli("db", "current", env=env)
        assert before.returncode == 0 and "<empty>" in before.stdout and "behind head" in before.stdout
        done = cli("db", "upgrade", env=env)
        assert done.returncode == 0, done.stderr
        assert f"upgraded from <empty> to {head_revision()}" in done.stdout
        assert "at head" in cli("db", "current", env=env).stdout
        open_database(StorageConfig(url=text), ".").close()


def test_cli_history_and_embedded_upgrade(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    listed = cli("db", "history", env={})
    assert listed.returncode == 0 and f"-> {head_revision()} (head)" in listed.stdout
    done = cli("db", "upgrade", env={"TRADEAGENT_DATA_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tradeagent.db").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://trader:hunter2@127.0.0.1:1/ledger", "database unavailable"),
        ("postgresql://trader:hunter2@host:notaport/db", "malformed database URL"),
        ("oracle://trader:hunter2@h/db", "unsupported dialect"),
    ],
)
def test_bad_or_unreachable_database_at_start(
    url: str, message: str, tmp_path: Path, cli: Callable[..., Ran]
) -> None:
    with pytest.raises((DatabaseUnavailable, InvalidDatabaseURL), match=message) as info:
        open_database(StorageConfig(url=url, connect_timeout_s=2), tmp_path)
    assert "hunter2" not in str(info.value)
    result = cli("db", "current", env={"TRADEAGENT_DB_URL": url})
    assert result.returncode == 2
    assert message in result.stderr and "hunter2" not in result.stderr + result.stdout


def test_the_real_cli_process_exits_non_zero_on_an_unreachable_database() -> None:
    result = tradeagent(
        "db", "upgrade", env={"TRADEAGENT_DB_URL": "postgresql://trader:hunter2@127.0.0.1:1/x"}
    )
    assert result.returncode == 2
    assert "database unavailable" in result.stderr and "trader:***@" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "content", [b"this is not a database" * 200, b"SQLite format 3\x00" + b"\xff" * 4000]
)
def test_a_corrupt_sqlite_file_is_refused_and_left_untouched(
    tmp_path: Path, content: bytes, cli: Callable[..., Ran]
) -> None:
    path = tmp_path / "tradeagent.db"
    path.write_bytes(content)
    with pytest.raises(CorruptDatabase, match="left untouched"):
        open_database(StorageConfig(), tmp_path)
    assert path.read_bytes() == content
    result = cli("db", "upgrade", env={"TRADEAGENT_DATA_DIR": str(tmp_path)})
    assert result.returncode == 2 and "corrupt" in result.stderr
    assert path.read_bytes() == content


def test_public_surface_is_pinned() -> None:
    assert all(getattr(storage, name) is not None for name in storage.__all__)
    assert sorted(storage.__all__) == [
        "CheckpointStore",
        "Database",
        "Instruments",
        "Journal",
        "LearnedFloors",
        "Leases",
        "Ledger",
        "ModelRegistry",
        "StorageConfig",
        "apply_fill",
        "open_database",
    ]


def test_migrations_downgrade_and_upgrade_again(target: Target) -> None:
    with target.open() as db:
        with db.connection() as connection, connection.begin():
            command.downgrade(_alembic_config(connection), "base")
        assert current_revision(db) is None
        assert upgrade(db) == (None, head_revision())


def test_sqlite_durability_setting_is_applied(tmp_path: Path) -> None:
    with open_database(StorageConfig(sqlite_synchronous="normal"), tmp_path) as db:
        sync = db.read(lambda s: s.connection().exec_driver_sql("PRAGMA synchronous").scalar(), what="t")
        assert sync == 1  # NORMAL


def test_instrument_set_key_is_canonical() -> None:
    assert instrument_set_key(["NQ", " ES", "ES"]) == "ES,NQ"
    with pytest.raises(InvalidRecord):
        instrument_set_key([])
    with pytest.raises(InvalidRecord):
        instrument_set_key(["ES,NQ"])
