"""A live feed's closing record reaches the decision queue in the pass of the event loop after
the one that queued it: the source wakes the feed task as it queues the batch, the task takes
the source's queue into its inbox itself, and a batch that closes a bar ends the run at once.
Measured in passes of the loop (``asyncio.sleep(0)``), so the test does not depend on the
machine's speed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np

from feeds.dbn import read_mbp10
from feeds.features import IncrementalFeatures
from feeds.sources import QueuedSource
from tests.daemon.support import INSTRUMENTS, config_text, live_intake, synth_feed, write_config
from tests.support.wait import wait_until_async

ES = INSTRUMENTS[0].instrument_id


class _Open(QueuedSource):
    """A live source whose batches the test queues one by one (as a transport's callback does)."""

    def __init__(self) -> None:
        super().__init__("open", max_batches=100_000, stale_after_s=600.0)

    async def _start(self) -> None:
        return None

    async def _stop(self) -> None:
        self._finish()

    def deliver(self, records: np.ndarray) -> None:
        self._emit_records(records)


def _seen(features: IncrementalFeatures, n: int) -> Callable[[], bool]:
    return lambda: features.by_id[ES].records_seen == n


async def test_a_closing_record_is_queued_for_its_decision_one_loop_pass_after_it_arrived(
    tmp_path: Path,
) -> None:
    synth_feed(tmp_path / "synth")
    config = write_config(
        tmp_path / "daemon.toml",
        config_text(tmp_path / "data", 'kind = "nats"\nnats_url = "nats://127.0.0.1:1"\ndataset = "SYNTH"'),
    )
    records = read_mbp10(tmp_path / "synth")
    mine = records[records["instrument_id"] == ES]
    features = IncrementalFeatures(config.feeds.instruments, config.feeds.bars, config.feeds.health)
    # which of ES's records close a bar (pushed one at a time on a throwaway copy of the features)
    probe = IncrementalFeatures(config.feeds.instruments, config.feeds.bars, config.feeds.health)
    closers = [k for k in range(1, 400) if probe.push_records(mine[k : k + 1])]
    assert len(closers) >= 3
    source = _Open()
    intake, queue, _ = live_intake(config, source, features, queue=1000)
    await intake.start()
    try:
        passes = []
        start = 0
        for closer in closers[:3]:
            source.deliver(mine[start:closer])  # the open bar's records: no close yet
            await wait_until_async(_seen(features, closer), 10, "the open bar's records pushed")
            before = len(list(queue))
            source.deliver(mine[closer : closer + 1])
            n = 0
            while len(list(queue)) == before and n < 10:
                await asyncio.sleep(0)
                n += 1
            passes.append(n)
            start = closer + 1
        assert passes == [1, 1, 1]
    finally:
        await intake.stop()
