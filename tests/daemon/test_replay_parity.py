"""The daemon replaying a recorded day and the event-driven backtest of that day trade the same
way: one trading step (agent/trading) serves both, so their decision streams (instrument, bar,
action, validity, target, Kelly size, decision by decision), orders and fills agree exactly, each
in its real SQLite ledger; with a daily-loss limit that binds, both halt at the same bar with the
same reason (the breach is checked after every decision round on the feed clock in both). Both
decide in the same rounds: the bars the clock closes at one moment (every quiet instrument's)
are one round, one batched decision, as the live daemon decides them.

The daemon runs in-process on the test's loop with its real sockets, the paper broker at the
configured latency and the replay source at full speed; it reports READY over a real
``NOTIFY_SOCKET`` datagram socket, as to systemd. The backtest is
:class:`agent.backtest.event.EventDriver` with the same checkpoint and configuration.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.backtest.event import REPLAY_BATCH, EventDriver
from agent.config import Config
from agent.daemon.app import Daemon
from agent.model.checkpoint import checkpoint_from_bytes
from agent.trading.decider import Decider, ModelDecider
from agent.trading.step import BarClose, Step, TradingStep
from feeds.dbn import read_mbp10
from feeds.features import BarFrame
from storage import open_database
from storage.config import StorageConfig
from tests.daemon.support import (
    INSTRUMENTS,
    config_text,
    install_model,
    model_checkpoint,
    replay_source,
    synth_feed,
    write_config,
)

RISK = {
    "loose": "\n[risk]\nmax_daily_loss = 1e12\nmax_drawdown = 1e12\n",
    "binding": "\n[risk]\nmax_daily_loss = 300.0\n",
}
"""Limits that never bind (every other rule is compared over the whole day), and a daily-loss
limit that this model on this day breaches part-way (the halt and the flatten are compared)."""

Decision = tuple[int, int, int, int, bool, int, float]
"""instrument id, bar index of the instrument, bar close time, action, valid, target, size."""


def _orders(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        query = "SELECT instrument_id, side, qty, order_type, ts_created_ns FROM orders"
        return conn.execute(query + " ORDER BY ts_created_ns, id").fetchall()


def _fills(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT instrument_id, side, qty, price, fee, ts_event_ns FROM fills ORDER BY ts_event_ns, id"
        ).fetchall()


def _stream(rows: list[tuple[int, int, int, bool, int, float]]) -> list[Decision]:
    """Rows (instrument id, close time, action, valid, target, size) in the order decided, with
    each instrument's bar index, sorted by (close time, instrument) as the backtest's log is."""
    seen: dict[int, int] = {}
    out = []
    for iid, ts, action, valid, target, size in rows:
        bar = seen.get(iid, 0)
        seen[iid] = bar + 1
        out.append((iid, bar, ts, action, valid, target, size))
    return sorted(out, key=lambda d: (d[2], d[0]))


async def _ready(sock: socket.socket) -> None:
    """Until the daemon sends READY=1 (STATUS-only datagrams may come first)."""
    loop = asyncio.get_running_loop()
    while b"READY=1" not in (await loop.sock_recv(sock, 65536)).split(b"\n"):
        pass


@pytest.mark.parametrize("risk", sorted(RISK))
async def test_daemon_replay_and_event_backtest_trade_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, risk: str
) -> None:
    feed = tmp_path / "synth"
    records = [int(read_mbp10(day).shape[0]) for day in synth_feed(feed)]
    config = write_config(
        tmp_path / "daemon.toml", config_text(tmp_path / "data", replay_source(feed, 0.0), extra=RISK[risk])
    )
    blob, fingerprint = model_checkpoint(seed=4)
    install_model(config, blob, fingerprint)
    rows, daemon_rounds, daemon_halt = await _daemon_replay(
        config, tmp_path / "notify.sock", monkeypatch, sum(records)
    )

    scratch = tmp_path / "backtest"
    database = open_database(StorageConfig(), scratch)
    decider = ModelDecider(
        checkpoint_from_bytes(blob),
        config.policy,
        [s.tick_value for s in INSTRUMENTS],
        "cpu",
        fee_per_contract=config.broker.fee_per_contract,
        max_batch=len(INSTRUMENTS),
    )
    backtest_rounds: list[int] = []
    real_decide = TradingStep.decide

    def counted(self: TradingStep, closes: list[BarClose], decider: Decider) -> Step:
        backtest_rounds.append(len(closes))
        return real_decide(self, closes, decider)

    try:
        with monkeypatch.context() as patch:
            patch.setattr(TradingStep, "decide", counted)
            run = await EventDriver(config, INSTRUMENTS, decider, database, [0.0, 0.0]).replay(feed, 0, 2**62)
    finally:
        decider.close()
        database.close()

    log = run.log.arrays()
    batches = sum(-(-n // REPLAY_BATCH) for n in records)  # the replay source's, file by file
    for i, spec in enumerate(INSTRUMENTS):  # the bars decided, kept one frame per replayed batch
        assert 1 <= len(run.frames[spec.symbol]) <= batches
        assert np.array_equal(
            BarFrame.concat(run.frames[spec.symbol]).ts_close, log["ts_ns"][log["instrument"] == i]
        )
    daemon_stream, backtest = _stream(rows), _logged(log)
    assert len(daemon_stream) == len(backtest) > 500
    assert daemon_rounds == backtest_rounds  # the closes decided together
    assert backtest_rounds.count(2) > 20, "both instruments' bars closed on the clock at one moment"
    assert sum(d[4] for d in backtest) > 100, "most decisions are valid"
    for k, (ours, theirs) in enumerate(zip(daemon_stream, backtest, strict=True)):
        assert ours == theirs, f"decision {k} differs: daemon {ours}, backtest {theirs}"
    daemon_db, backtest_db = Path(config.data_dir) / "tradeagent.db", scratch / "tradeagent.db"
    assert len(_fills(backtest_db)) > 20, "the model should trade on this day"
    assert _orders(daemon_db) == _orders(backtest_db)
    assert _fills(daemon_db) == _fills(backtest_db)
    # this thin feed leaves many bars to the clock: both place their orders at that moment
    assert run.counts["clock_close_bars"] > len(backtest) // 10
    interval, grace = round(config.feeds.bars.interval_s * 1e9), config.daemon.close_grace_ns
    assert any((o[4] - grace - 1) % interval == 0 for o in _orders(daemon_db))
    if risk == "binding":
        assert run.halt_reason.startswith("daily loss") and daemon_halt == run.halt_reason
    else:
        assert run.halt_reason == "" and daemon_halt == ""


async def _daemon_replay(
    config: Config, notify_path: Path, monkeypatch: pytest.MonkeyPatch, total: int
) -> tuple[list[tuple[int, int, int, bool, int, float]], list[int], str]:
    """The daemon replaying its feed (``total`` records) to the end, READY sent to a socket at
    ``notify_path``: the rows it decided (:func:`_stream`'s input), the rows of each of its
    decision rounds and its risk halt ("" if none)."""
    rows: list[tuple[int, int, int, bool, int, float]] = []
    rounds: list[int] = []
    real_decide = TradingStep.decide

    def recorded(self: TradingStep, closes: list[BarClose], decider: Decider) -> Step:
        rounds.append(len(closes))
        step = real_decide(self, closes, decider)
        d = step.decided
        for j, c in enumerate(closes):
            rows.append(
                (
                    c.instrument_id,
                    int(c.frame.ts_close[c.row]),
                    int(d.action[j]),
                    bool(d.valid[j]),
                    int(d.target[j]),
                    float(d.size[j]),
                )
            )
        return step

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.setblocking(False)
    with monkeypatch.context() as patch:
        patch.setenv("NOTIFY_SOCKET", str(notify_path))
        patch.setattr(TradingStep, "decide", recorded)
        daemon = Daemon(config)
        task = asyncio.create_task(daemon.run())
        try:
            async with asyncio.timeout(300):
                ready = asyncio.create_task(_ready(notify))
                await asyncio.wait([ready, task], return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    task.result()  # the daemon failed at start: its error
                await ready
                await daemon.end_of_data()  # every record replayed, every report committed and counted
            status = daemon.status()
            assert status.feed["records"] == total and status.open_orders == 0
        finally:
            daemon.request_stop()
            assert await asyncio.wait_for(task, 60) == 0
            notify.close()
    return rows, rounds, status.halts.get("risk", "")


def _logged(log: dict[str, np.ndarray]) -> list[Decision]:
    """The backtest's decision log as :data:`Decision` tuples."""
    ids = np.asarray([s.instrument_id for s in INSTRUMENTS])[log["instrument"].astype(np.int64)]
    columns = (log["bar"], log["ts_ns"], log["action"], log["valid"], log["target"], log["size"])
    return [
        (int(iid), int(bar), int(ts), int(a), bool(v), int(t), float(z))
        for iid, bar, ts, a, v, t, z in zip(ids, *columns, strict=True)
    ]
