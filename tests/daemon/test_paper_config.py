"""README "5. The paper daemon" as written, with real processes: ``config/paper.toml`` itself
(ES and NQ on the NATS feed), a checkpoint for ES and NQ promoted, a relay of synthetic files
(``tradeagent relay`` with the defaults, as the README runs it) and ``tradeagent --config
config/paper.toml run``, both with ``TRADEAGENT__FEEDS__SOURCE__DATASET=SYNTH``. Only what a
test must change is overridden in the environment: the private nats-server's URL, the data
directory and the metrics port (0: the test may share the machine). The daemon places orders,
and after its stop the ledger holds exactly the orders and fills it counted, with its positions
and P&L. The README's fallback holds too: a candidate the gates rejected, named by
``TRADEAGENT__DAEMON__CHECKPOINT``, is the model ``config/paper.toml`` serves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import load_config
from feeds.dbn import read_mbp10
from storage import ModelRegistry, open_database
from tests.conftest import REPO
from tests.daemon.support import (
    INSTRUMENTS,
    DaemonProcess,
    assert_ledger_is,
    install_model,
    model_checkpoint,
    running,
    synth_feed,
)
from tests.support.nats_server import NatsServer

pytestmark = pytest.mark.slow

PAPER = REPO / "config" / "paper.toml"


def _environment(tmp_path: Path, nats: NatsServer) -> dict[str, str]:
    return {
        "TRADEAGENT__FEEDS__SOURCE__DATASET": "SYNTH",  # the README's export
        "TRADEAGENT__FEEDS__SOURCE__NATS_URL": nats.url,
        "TRADEAGENT_DATA_DIR": str(tmp_path / "state"),
        "TRADEAGENT__CONTROL__METRICS_PORT": "0",
    }


def test_config_paper_toml_trades_as_the_readme_runs_it(tmp_path: Path, nats_server: NatsServer) -> None:
    feed = tmp_path / "synth"
    synth_feed(feed)  # dataset SYNTH, ES and NQ (the ids and ticks of feeds.instruments)
    env = _environment(tmp_path, nats_server)
    config = load_config(PAPER, env=env)
    assert [(s.symbol, s.instrument_id) for s in config.feeds.instruments] == [
        (s.symbol, s.instrument_id) for s in INSTRUMENTS
    ]
    install_model(config, *model_checkpoint())  # what `train --promote` leaves for ES and NQ
    relay_log = tmp_path / "relay.log"
    with DaemonProcess(PAPER, tmp_path / "daemon.log", env) as daemon:
        daemon.start()
        # The README's relay, at 40 times its real-time pace: the 5-minute session in ~8 s.
        command = ["relay", "--source", "replay", "--path", str(feed), "--pace", "40"]
        with relay_log.open("ab") as log:
            relay = subprocess.run(
                [sys.executable, "-m", "agent.cli", *command],
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=120,
                check=False,
            )
        assert relay.returncode == 0, relay_log.read_text(errors="replace")[-3000:]
        daemon.wait_until(lambda s: s["feed"]["records"] == len(read_mbp10(feed)))
        status = daemon.finish()
    counts = status["counts"]
    assert counts["orders"] > 0 and counts["fills"] > 0, status
    assert status["model"] and not status["halts"]
    assert counts["fills"] == counts["fills_received"]
    assert_ledger_is(config, status)


async def test_a_rejected_candidate_named_by_daemon_checkpoint_is_served(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    env = _environment(tmp_path, nats_server)
    sha = install_model(load_config(PAPER, env=env), *model_checkpoint(), promote=False)
    database = open_database(load_config(PAPER, env=env).storage, env["TRADEAGENT_DATA_DIR"])
    try:
        ModelRegistry(database).reject(sha, reason="not promoted: below the incumbent")
    finally:
        database.close()
    config = load_config(PAPER, env={**env, "TRADEAGENT__DAEMON__CHECKPOINT": sha})
    async with running(config) as daemon:
        status = daemon.status()
        assert status.model == sha
        assert "model" not in status.halts
