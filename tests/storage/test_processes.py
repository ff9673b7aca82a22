"""Real processes against real databases: concurrent writers and SIGKILL after acknowledgement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from storage import Instruments, Journal, LearnedFloors, Ledger, ModelRegistry
from storage.tables import FillRow, FoldRow, GateEventRow, LearnedFloorChangeRow, OrderRow, TrainRunRow
from tests.storage.conftest import ES, NQ, Target

WORKER = Path(__file__).with_name("worker.py")


def spawn(target: Target, *jobs: tuple[str, int]) -> list[subprocess.Popen[str]]:
    """A worker per job (mode, n), all released at once when every one is started: the pipe they
    wait on is closed."""
    go, release = os.pipe()
    try:
        return [
            subprocess.Popen(
                [sys.executable, str(WORKER), mode, target.config.url, str(target.data_dir), str(go), str(n)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=Path(__file__).resolve().parents[2],
                pass_fds=(go,),
            )
            for mode, n in jobs
        ]
    finally:
        os.close(go)
        os.close(release)


def test_daemon_and_retrain_processes_write_at_once(target: Target, tmp_path: Path) -> None:
    with target.open() as db:
        Instruments(db).upsert([ES, NQ])
    orders, runs = 200, 8
    workers = spawn(target, ("daemon", orders), ("retrain", runs))
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
        assert "Traceback" not in err  # nothing, "database is locked" included, escaped

    with target.open() as db:

        def count(model: type) -> int:
            return int(db.read(lambda s: s.scalar(select(func.count()).select_from(model)), what="count"))

        def distinct(column: object) -> int:
            return int(db.read(lambda s: s.scalar(select(func.count(func.distinct(column)))), what="count"))

        assert count(OrderRow) == orders and count(FillRow) == orders
        assert distinct(FillRow.fill_id) == orders
        ledger = Ledger(db)
        assert ledger.open_orders() == []
        assert all(o.filled_qty == 1 for o in (ledger.order(f"o{i}") for i in range(0, orders, 37)))
        positions = ledger.positions()
        assert positions == ledger.rebuild().positions
        assert sum(abs(p.qty) for p in positions.values()) <= orders
        net = sum(1 if i % 3 else -1 for i in range(orders))
        assert sum(p.qty for p in positions.values()) == net

        assert count(TrainRunRow) == runs and count(FoldRow) == 3 * runs and count(GateEventRow) == 2 * runs
        assert count(LearnedFloorChangeRow) == 2 * runs
        assert LearnedFloors(db).get(1001, "vol_ref").value == 1e-8 * runs  # type: ignore[union-attr]
        registry = ModelRegistry(db)
        assert len(registry.checkpoints()) == runs
        assert len(registry.checkpoints(status="promoted")) == 1
        assert len(registry.checkpoints(status="rejected")) == runs // 2
        journal = Journal(db)
        assert len(journal.events(kind="heartbeat")) == orders // 20
        assert len(journal.events(kind="promotion")) == (runs + 1) // 2
        assert len(journal.events(kind="rejection")) == runs // 2


def test_an_acknowledged_fill_survives_sigkill_of_the_writer(target: Target, tmp_path: Path) -> None:
    with target.open() as db:
        Instruments(db).upsert([ES, NQ])
    (worker,) = spawn(target, ("ack", 50))
    assert worker.stdout is not None
    line = worker.stdout.readline()
    os.kill(worker.pid, signal.SIGKILL)
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    assert line.startswith("ACK "), err
    acknowledged = line.split()[1:]
    assert len(acknowledged) == 50
    with target.open() as db:
        stored = {f.fill_id for f in Ledger(db).fills()}
        assert set(acknowledged) <= stored
        assert Ledger(db).positions()[1001].qty + Ledger(db).positions()[1002].qty == sum(
            1 if i % 3 else -1 for i in range(50)
        )
