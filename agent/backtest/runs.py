"""What a backtest run stands on, shared by :mod:`agent.backtest.api` and the backtest benchmark
(:mod:`agent.bench.backtest`): the decider of a run and the event driver's throwaway ledger."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from agent.config import Config
from agent.model.checkpoint import Checkpoint
from agent.trading.decider import ModelDecider
from feeds.config import InstrumentSpec
from storage.config import StorageConfig
from storage.database import Database
from storage.schema import open_database

__all__ = ["run_decider", "scratch_ledger"]


def run_decider(
    checkpoint: Checkpoint, config: Config, specs: Sequence[InstrumentSpec], chunks: int = 1
) -> ModelDecider:
    """The model's decider for a run over ``specs``: one slot per instrument and span
    (``chunks`` spans per instrument stepped in lockstep; 1 for the event-driven driver), on
    the configured device, policy, fees and CPU threads."""
    return ModelDecider(
        checkpoint,
        config.policy,
        [s.tick_value for s in specs for _ in range(chunks)],
        config.device,
        fee_per_contract=config.broker.fee_per_contract,
        max_batch=len(specs) * chunks,
        cpu_threads=config.train.cpu_threads,
    )


@contextmanager
def scratch_ledger(prefix: str) -> Iterator[Database]:
    """The event-driven driver's throwaway SQLite ledger in a new directory named ``prefix...``,
    deleted afterwards. It lives in memory-backed storage where there is one: its commits are
    real transactions, but an fsync there costs nothing."""
    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() else None))
    try:
        database = open_database(StorageConfig(sqlite_synchronous="normal"), scratch)
        try:
            yield database
        finally:
            database.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
