"""Databento Live at its callback boundary.

The paid gateway is unreachable, so these tests use a real ``databento.Live`` client (its own
background event-loop thread and callback registry) whose four network methods are replaced by
:class:`Gateway` (the one place in the suite where a mock is allowed). Records are real DBN
records decoded by ``databento_dbn``, dispatched on the client's thread through the library's
own dispatch code, exactly as a live session would.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import databento
import databento_dbn
import numpy as np
import pandas as pd  # type: ignore[import-untyped]
import pytest
from databento.live.session import _SessionProtocol

from feeds.errors import FeedError
from feeds.sources import DatabentoLiveSource, HealthEvent, HealthKind, RecordBatch, load_api_key
from tests.support.feed_data import DATASET, feed_records
from tests.support.wait import wait_until_async

KEY = "db-TESTKEY0123456789abcdefTESTKEY"


class Gateway:
    """Replaces the network side of each ``databento.Live`` the source creates."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fail_subscribe: Exception | None = None) -> None:
        self.loop = loop
        self.clients: list[databento.Live] = []
        self.kwargs: list[dict[str, Any]] = []
        self.subscriptions: list[dict[str, Any]] = []
        self.started = 0
        self.terminated = 0
        self.closed = asyncio.Event()
        self.fail_subscribe = fail_subscribe

    def factory(self, **kwargs: Any) -> databento.Live:
        client = databento.Live(**kwargs)
        self.kwargs.append(kwargs)
        self.clients.append(client)

        def subscribe(**sub: Any) -> int:
            if self.fail_subscribe is not None:
                raise self.fail_subscribe
            self.subscriptions.append(sub)
            return 1

        def start() -> None:
            self.started += 1

        def terminate() -> None:  # also called by Live.__del__, maybe after the test loop closed
            self.terminated += 1
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.closed.set)

        async def wait_for_close(timeout: float | None = None) -> None:
            await self.closed.wait()

        client.subscribe = subscribe  # type: ignore[method-assign,assignment]
        client.start = start  # type: ignore[method-assign]
        client.terminate = terminate  # type: ignore[method-assign]
        client.wait_for_close = wait_for_close  # type: ignore[method-assign]
        return client

    @property
    def client(self) -> databento.Live:
        return self.clients[-1]

    def _on_client_thread(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on the client's event-loop thread and wait for it."""
        done = asyncio.run_coroutine_threadsafe(_call(fn, *args), self.client._loop)
        done.result(timeout=30)

    def send(self, records: list[Any]) -> None:
        """Dispatch ``records`` with the library's own callback dispatch, on its thread."""
        session = self.client._session
        protocol = types.SimpleNamespace(_user_callbacks=session._user_callbacks)

        def dispatch() -> None:
            for record in records:
                _SessionProtocol._dispatch_callbacks(protocol, record)  # type: ignore[arg-type]

        self._on_client_thread(dispatch)

    def reconnect(self, gap_start_ns: int, gap_end_ns: int) -> None:
        session = self.client._session
        self._on_client_thread(
            session._dispatch_reconnect_callbacks,
            pd.Timestamp(gap_start_ns, tz="UTC"),
            pd.Timestamp(gap_end_ns, tz="UTC"),
        )


async def _call(fn: Any, *args: Any) -> None:
    fn(*args)


def dbn_records(records: np.ndarray) -> list[Any]:
    """Real ``databento_dbn`` record objects decoded from the records' DBN bytes."""
    return list(
        databento_dbn.DBNDecoder(has_metadata=False, input_version=3).write_and_decode(records.tobytes())
    )


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("DATABENTO_API_KEY", KEY)
    yield KEY


async def next_batches(source: DatabentoLiveSource, records: int) -> tuple[np.ndarray, list[HealthEvent]]:
    got: list[np.ndarray] = []
    health: list[HealthEvent] = []
    while sum(len(b) for b in got) < records:
        event = await asyncio.wait_for(source.next(), 30)
        if isinstance(event, RecordBatch):
            got.append(event.records)
        elif isinstance(event, HealthEvent):
            health.append(event)
    return np.concatenate(got), health


async def test_records_from_the_client_thread_arrive_as_batches(
    api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = Gateway(asyncio.get_running_loop())
    source = DatabentoLiveSource(dataset=DATASET, symbols=("ES", "NQ"), client_factory=gateway.factory)
    await source.start()
    try:
        assert gateway.kwargs == [{"key": KEY, "reconnect_policy": "reconnect"}]
        assert gateway.subscriptions == [{"dataset": DATASET, "schema": "mbp-10", "symbols": ["ES", "NQ"]}]
        assert gateway.started == 1
        records = feed_records(500)
        mapping = databento_dbn.SymbolMappingMsg(
            1,
            1001,
            int(records["ts_event"][0]),
            databento_dbn.SType.RAW_SYMBOL,  # type: ignore[arg-type]
            "ES",
            databento_dbn.SType.RAW_SYMBOL,  # type: ignore[arg-type]
            "ES",
            0,
            0,
        )
        heartbeat = databento_dbn.SystemMsg(int(records["ts_event"][0]), "Heartbeat")
        gateway.send([mapping, heartbeat, *dbn_records(records)])
        got, health = await next_batches(source, len(records))
        assert got.tobytes() == records.tobytes()
        assert health == []
        assert source.symbols == {1001: "ES"}
        assert source.counters.records == len(records)
    finally:
        await source.stop()
    assert gateway.terminated == 1
    assert KEY not in caplog.text


async def test_reconnect_is_reported_with_the_gap_interval(api_key: str) -> None:
    gateway = Gateway(asyncio.get_running_loop())
    source = DatabentoLiveSource(dataset=DATASET, symbols=("ES",), client_factory=gateway.factory)
    await source.start()
    try:
        records = feed_records(50)
        before, after = records[:40], records[40:]
        gateway.send(dbn_records(before))
        down, up = int(before["ts_event"][-1]), int(after["ts_event"][0])
        gateway.reconnect(down, up)
        gateway.send(dbn_records(after))
        got, health = await next_batches(source, len(records))
        assert got.tobytes() == records.tobytes()
        assert [e.kind for e in health] == [HealthKind.RECONNECTED, HealthKind.GAP]
        assert all(e.disconnected_at_ns == down and e.reconnected_at_ns == up for e in health)
        assert source.counters.reconnects == 1 and source.counters.gaps == 1
    finally:
        await source.stop()


async def test_a_slow_consumer_loses_records_counted_never_silently(api_key: str) -> None:
    gateway = Gateway(asyncio.get_running_loop())
    source = DatabentoLiveSource(
        dataset=DATASET, symbols=("ES",), max_batches=1, client_factory=gateway.factory
    )
    await source.start()
    try:
        records = feed_records(2555)  # 5110 records
        # Our loop is blocked while the client thread delivers them all: the bridge holds 4096
        # records at most (one queue slot's worth), the rest is dropped and counted.
        gateway.send(dbn_records(records[:5000]))
        # The bridge drains: 904 dropped, one batch of 4096 queued.
        await wait_until_async(lambda: source.counters.dropped_records == 904, 10, "904 records dropped")
        gateway.send(dbn_records(records[5000:5100]))  # the only queue slot is taken: dropped
        await wait_until_async(lambda: source.counters.dropped_records == 1004, 10, "100 more dropped")
        first = [await asyncio.wait_for(source.next(), 30) for _ in range(2)]
        gateway.send(dbn_records(records[5100:]))  # room again: the queue drop episode is reported
        second = [await asyncio.wait_for(source.next(), 30) for _ in range(2)]
        events = first + second
        kinds = [e.kind if isinstance(e, HealthEvent) else len(e) for e in events if e is not None]
        assert kinds == [HealthKind.DROPPED, 4096, HealthKind.DROPPED, 10]
        assert [e.count for e in events if isinstance(e, HealthEvent)] == [904, 100]
        batch = events[1]
        assert isinstance(batch, RecordBatch)
        assert batch.records.tobytes() == records[:4096].tobytes()
        assert source.counters.dropped_records == 1004
    finally:
        await source.stop()


async def test_gateway_error_records_are_counted(api_key: str) -> None:
    gateway = Gateway(asyncio.get_running_loop())
    source = DatabentoLiveSource(dataset=DATASET, symbols=("ES",), client_factory=gateway.factory)
    await source.start()
    try:
        records = feed_records(5)
        gateway.send(
            [
                databento_dbn.ErrorMsg(int(records["ts_event"][0]), "symbol not found: ZZ"),
                *dbn_records(records),
            ]
        )
        got, _ = await next_batches(source, len(records))
        assert got.tobytes() == records.tobytes()
        assert source.gateway_errors == 1
    finally:
        await source.stop()


async def test_session_failure_is_a_feed_error_that_hides_the_key(api_key: str) -> None:
    gateway = Gateway(
        asyncio.get_running_loop(), fail_subscribe=ValueError(f"authentication failed for {KEY}")
    )
    source = DatabentoLiveSource(dataset=DATASET, symbols=("ES",), client_factory=gateway.factory)
    with pytest.raises(FeedError) as failure:
        await source.start()
    assert KEY not in str(failure.value)
    assert "***" in str(failure.value)


async def test_the_gateway_closing_the_session_ends_iteration_with_an_error(api_key: str) -> None:
    gateway = Gateway(asyncio.get_running_loop())
    source = DatabentoLiveSource(dataset=DATASET, symbols=("ES",), client_factory=gateway.factory)
    await source.start()
    try:
        gateway.closed.set()
        with pytest.raises(FeedError, match="closed the live session"):
            await asyncio.wait_for(source.next(), 30)
    finally:
        await source.stop()


def test_api_key_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "databento.key"
    key_file.write_text(f"{KEY}\n")
    assert load_api_key(str(key_file), env={}) == KEY
    assert load_api_key("", env={"DATABENTO_API_KEY": KEY}) == KEY
    with pytest.raises(FeedError, match="DATABENTO_API_KEY"):
        load_api_key("", env={})
    key_file.write_text("\n")
    with pytest.raises(FeedError, match="empty"):
        load_api_key(str(key_file), env={})
    with pytest.raises(FeedError, match="cannot read"):
        load_api_key(str(tmp_path / "missing.key"), env={})


def test_symbols_are_required() -> None:
    with pytest.raises(FeedError, match="symbols"):
        DatabentoLiveSource(dataset=DATASET, symbols=())
