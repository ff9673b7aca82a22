"""One daemon per configuration and ledger, with real ``tradeagent`` subprocesses:

* a second daemon on the same configuration, started while the first one trades, exits 2
  naming the first one's pid and host in one line, touches none of its sockets (``tradeagent
  ctl status`` still answers the first, which trades on), and the operator's halt and resume
  through ``tradeagent ctl`` are in the first one's log; the data directory, ledger and lock
  file it created are owner-only; after the first one's stop the ledger holds exactly the
  orders and fills it counted;
* a daemon of another data directory sharing the PostgreSQL ledger is refused by the lease,
  and starts once the first stopped cleanly (which released it);
* a SIGKILLed daemon blocks nothing: the next start takes its lease over and closes its
  session with the reason;
* a daemon whose lease another one took over stops with exit code 1;
* a telemetry endpoint on tcp without CURVE keys is refused when the configuration loads.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import update

from agent.config import Config
from agent.daemon.app import Daemon
from agent.daemon.lifecycle import State
from storage import Journal, Leases, open_database
from storage.errors import NotFound
from storage.tables import DaemonLeaseRow
from tests.daemon.support import (
    DaemonProcess,
    assert_ledger_is,
    config_text,
    install_model,
    model_checkpoint,
    replay_source,
    synth_feed,
    write_config,
)
from tests.support.cli import refusal
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.slow

HOST = socket.gethostname()


@pytest.fixture(scope="module")
def feed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("feed")
    synth_feed(out)
    return out


def _config(where: Path, feed: Path, *, storage_url: str = "", pace: float = 1.0) -> tuple[Path, Config]:
    """A daemon configuration replaying ``feed`` at ``pace`` x real time (no model: it runs,
    halted, until one is installed)."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "paper.toml"
    return path, write_config(
        path, config_text(where / "data", replay_source(feed, pace), storage_url=storage_url)
    )


def _cli(config_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "--config", str(config_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def umask() -> Iterator[None]:
    """The usual permissive umask, so that owner-only modes are the daemon's doing."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask")
def test_a_second_daemon_on_one_config_exits_2_and_leaves_the_first_alone(tmp_path: Path, feed: Path) -> None:
    config_path, config = _config(tmp_path, feed, pace=10.0)  # the 5-minute session in ~30 s
    install_model(config, *model_checkpoint())
    with DaemonProcess(config_path, tmp_path / "first.log") as first:
        first.start()
        assert first.proc is not None
        trading = first.wait_until(lambda s: s["counts"].get("fills", 0) >= 1)
        second = refusal(_cli(config_path, "run"))  # while the first one trades
        assert f"daemon.lock is held by another daemon (pid {first.proc.pid} on host {HOST})" in second
        status = _cli(config_path, "ctl", "status", "--json")
        assert status.returncode == 0, status.stderr
        session_id = json.loads(status.stdout)["session_id"]
        assert json.loads(status.stdout)["state"] == "running"
        first.wait_until(lambda s: s["counts"]["orders"] > trading["counts"]["orders"])  # it trades on
        assert _cli(config_path, "ctl", "halt", "--reason", "news at 14:30").returncode == 0
        assert _cli(config_path, "ctl", "resume").returncode == 0
        log = first.log_tail(1_000_000)
        who = rf"\S+@{re.escape(HOST)} pid \d+"
        assert re.search(rf"WARNING .*operator halt from {who}: news at 14:30", log), log
        assert re.search(rf"WARNING .*operator resume from {who}: cleared operator", log), log
        data = Path(config.data_dir)
        modes = {p.name: _mode(p) for p in (data, data / "tradeagent.db", data / "daemon.lock", data / "run")}
        assert modes == {"data": 0o700, "tradeagent.db": 0o600, "daemon.lock": 0o600, "run": 0o700}
        final = first.finish()  # the feed replayed to its end, no order open
    # The default layout: the spill directory shares the ledger's disk, which the start says.
    assert "is on the filesystem of the SQLite ledger" in first.log_tail(1_000_000)
    # The refused daemon touched nothing: the ledger is exactly what the first one counted.
    assert final["counts"]["fills"] == final["counts"]["fills_received"] > 0
    assert_ledger_is(config, final)
    database = open_database(config.storage, config.data_dir)
    try:
        assert Journal(database).session(session_id).end_reason == "stopped"
        with pytest.raises(NotFound):  # the refused daemon never started a session
            Journal(database).session(session_id + 1)
        assert Leases(database).held() == []
    finally:
        database.close()


def test_the_lease_refuses_a_daemon_of_another_data_dir_on_one_postgresql(
    tmp_path: Path, feed: Path, pg_url: str
) -> None:
    first_path, _ = _config(tmp_path / "a", feed, storage_url=pg_url)
    second_path, config = _config(tmp_path / "b", feed, storage_url=pg_url)
    with DaemonProcess(first_path, tmp_path / "first.log") as first:
        first.start()
        assert first.proc is not None
        refused = _cli(second_path, "run")
        assert refused.returncode == 2, refused.stderr
        assert "another daemon trades this ledger" in refused.stderr
        assert f"pid {first.proc.pid} on host {HOST}" in refused.stderr
        assert "daemon.lease_timeout_s" in refused.stderr
        assert first.status()["state"] == "running"
        assert first.terminate() == 0, first.log_tail()
    with DaemonProcess(second_path, tmp_path / "second.log") as second:
        second.start()  # the clean stop released the lease
        assert second.proc is not None
        with open_database(config.storage, config.data_dir) as database:
            assert {(h.pid, h.host) for h in Leases(database).held()} == {(second.proc.pid, HOST)}
        assert second.terminate() == 0, second.log_tail()


def test_a_sigkilled_daemons_session_is_closed_by_the_next_start(tmp_path: Path, feed: Path) -> None:
    config_path, config = _config(tmp_path, feed)
    with (
        DaemonProcess(config_path, tmp_path / "killed.log") as killed,
        DaemonProcess(config_path, tmp_path / "restarted.log") as restarted,
    ):
        killed.start()
        killed_session = killed.status()["session_id"]
        killed.kill()
        restarted.start()  # neither the lock, the lease nor the sockets left behind stop it
        session_id = restarted.status()["session_id"]
        assert f"daemon session {killed_session} (pid" in restarted.log_tail(1_000_000)
        assert restarted.terminate() == 0, restarted.log_tail()
    database = open_database(config.storage, config.data_dir)
    try:
        journal = Journal(database)
        closed = journal.session(killed_session)
        assert closed.ended_at is not None and closed.end_reason is not None
        assert closed.end_reason.startswith("not closed: the process ended without a clean stop")
        assert journal.session(session_id).end_reason == "stopped"
        assert [e.details["previous_session"] for e in journal.events(kind="takeover")] == [killed_session]
        assert Leases(database).held() == []
    finally:
        database.close()


async def test_a_daemon_whose_lease_was_taken_over_stops_with_exit_code_1(
    tmp_path: Path, feed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, config = _config(tmp_path, feed)
    config = msgspec.structs.replace(
        config, daemon=msgspec.structs.replace(config.daemon, lease_timeout_s=0.3)
    )
    daemon = Daemon(config)
    task = asyncio.create_task(daemon.run())
    await wait_until_async(lambda: daemon.state is State.RUNNING or task.done(), 60, "the daemon to run")
    assert not task.done(), task.result()
    database = open_database(config.storage, config.data_dir)
    try:  # what a daemon elsewhere does when this one's heartbeat went stale
        other = Journal(database).start_session(mode="paper", host="elsewhere", pid=4242, version="t")
        database.write(
            lambda s: s.execute(update(DaemonLeaseRow).values(session_id=other, host="elsewhere", pid=4242)),
            what="take the leases over",
        )
    finally:
        database.close()
    assert await asyncio.wait_for(task, 60) == 1
    assert f"lost its lease, now held by daemon session {other} (pid 4242 on host elsewhere)" in caplog.text
    assert "another daemon trades this ledger now; stopping" in caplog.text


def test_telemetry_over_tcp_without_keys_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "open.toml"
    path.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[control]\ntelemetry_endpoint = "tcp://0.0.0.0:5556"\n',
        encoding="utf-8",
    )
    result = _cli(path, "run")
    assert result.returncode == 2
    assert f"{path}: key 'control" in result.stderr and "telemetry_endpoint" in result.stderr
    assert "CURVE is not configured" in result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created or bound
