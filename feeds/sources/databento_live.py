"""Databento Live as a source: ``databento.Live`` subscribed to ``mbp-10`` for the configured
symbols, its records bridged into the asyncio loop.

* **Credentials**: the API key comes from ``SourceConfig.databento_key_file`` (a file holding
  only the key, e.g. a systemd ``LoadCredential=``) or else ``DATABENTO_API_KEY``. It is never
  logged; library errors that could echo it are redacted before they leave this module.
* **Threads**: the client runs its own event loop on a background thread and calls back once
  per record there. A :class:`~feeds.sources.thread_bridge.ThreadBridge` batches the record
  bytes onto our loop; there they are checked by :class:`feeds.dbn.StreamDecoder` and queued as
  :class:`RecordBatch` values in a bounded queue (drops counted, reported as ``DROPPED``).
* **Reconnect**: with ``databento_reconnect`` the client's ``ReconnectPolicy.RECONNECT``
  re-subscribes by itself; its reconnect callback gives the last ``ts_event`` seen before the
  drop and the start of the new session, reported as ``RECONNECTED`` plus ``GAP`` events with
  that interval (records in it are lost; ``sequence_gap`` is unknown here and per instrument the
  book's sequence check measures it). Without reconnect, a dropped session ends the iteration
  with :class:`FeedError`.
* Symbol mappings update :attr:`symbols`; gateway error records are logged and counted,
  heartbeats ignored.

The paid gateway is unreachable in tests: they drive the client's callbacks directly with
real DBN records (tests/feeds/test_databento_live.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import databento
import databento_dbn
from databento.common.error import BentoError

from feeds.dbn import StreamDecoder
from feeds.errors import FeedError
from feeds.sources.base import QueuedSource
from feeds.sources.events import HealthEvent, HealthKind
from feeds.sources.thread_bridge import ThreadBridge

__all__ = ["DatabentoLiveSource", "load_api_key"]

log = logging.getLogger(__name__)

API_KEY_ENV = "DATABENTO_API_KEY"
RECORDS_PER_BATCH_BOUND = 4096
"""Pending records allowed per queued batch slot before the bridge drops (with max_batches)."""
CLOSE_TIMEOUT_S = 5.0


def load_api_key(key_file: str = "", env: dict[str, str] | None = None) -> str:
    """The Databento API key: the content of ``key_file`` if given, else ``$DATABENTO_API_KEY``.

    Raises :class:`FeedError` (that never contains the key) when neither yields a key.
    """
    environ = os.environ if env is None else env
    if key_file:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise FeedError(f"cannot read the Databento key file {key_file}: {exc.strerror}") from None
        if not key:
            raise FeedError(f"the Databento key file {key_file} is empty")
        return key
    key = environ.get(API_KEY_ENV, "").strip()
    if not key:
        raise FeedError(f"no Databento API key: set {API_KEY_ENV} or feeds.source.databento_key_file")
    return key


def _ns(timestamp: Any) -> int:
    """pandas.Timestamp (what the reconnect callback passes) -> ns since the epoch."""
    return int(getattr(timestamp, "value", timestamp))


class DatabentoLiveSource(QueuedSource):
    """MBP-10 records from the Databento Live gateway (see the module docstring).

    ``client_factory`` builds the client (``databento.Live`` by default) from keyword arguments
    ``key`` and ``reconnect_policy``. ``instruments`` (instrument_id -> symbol) restricts what is
    passed on, as for every source (:class:`~feeds.sources.base.Source`).
    """

    def __init__(
        self,
        *,
        dataset: str,
        symbols: tuple[str, ...],
        key_file: str = "",
        reconnect: bool = True,
        max_batches: int = 1024,
        stale_after_s: float = 5.0,
        client_factory: Callable[..., databento.Live] = databento.Live,
        instruments: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(
            f"databento:{dataset}",
            max_batches=max_batches,
            stale_after_s=stale_after_s,
            instruments=instruments,
        )
        if not symbols:
            raise FeedError("Databento Live needs feeds.source.symbols (the symbols to subscribe to)")
        self.dataset: str = dataset
        self.subscribed = symbols
        self._key_file = key_file
        self._reconnect = reconnect
        self._factory = client_factory
        self._client: databento.Live | None = None
        self._bridge: ThreadBridge | None = None
        self._decoder = StreamDecoder(framing="message")
        self._closer: asyncio.Task[None] | None = None
        self.gateway_errors = 0

    async def _start(self) -> None:
        key = load_api_key(self._key_file)
        loop = asyncio.get_running_loop()
        self._bridge = ThreadBridge(loop, self._on_drain, self._max_batches * RECORDS_PER_BATCH_BOUND)
        try:
            client = self._factory(key=key, reconnect_policy="reconnect" if self._reconnect else "none")
            client.add_callback(self._on_record, self._on_callback_error)
            client.add_reconnect_callback(self._on_reconnect, self._on_callback_error)
            self._client = client
            # subscribe() opens the TCP session and authenticates: blocking, so off the loop.
            await asyncio.to_thread(
                client.subscribe, dataset=self.dataset, schema="mbp-10", symbols=list(self.subscribed)
            )
            client.start()
        except (BentoError, ValueError, OSError) as exc:
            raise FeedError(f"{self.name}: cannot start the live session: {self._redact(exc, key)}") from None
        self._closer = asyncio.create_task(self._wait_for_close(), name=f"{self.name}-close")
        log.info("%s: subscribed to mbp-10 %s", self.name, list(self.subscribed))

    async def _stop(self) -> None:
        if self._bridge is not None:
            self._bridge.close()
        closer, self._closer = self._closer, None
        if closer is not None:
            closer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closer
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(BentoError, ValueError):
                client.terminate()

    @staticmethod
    def _redact(exc: BaseException, key: str) -> str:
        return str(exc).replace(key, "***") if key else str(exc)

    async def _wait_for_close(self) -> None:
        client = self._client
        assert client is not None
        try:
            await client.wait_for_close()
        except BentoError as exc:
            self._finish(FeedError(f"{self.name}: live session lost: {exc}"))
            return
        self._finish(FeedError(f"{self.name}: the gateway closed the live session"))

    # ------------------------------------------------------------ Databento's thread

    def _on_record(self, record: databento_dbn.DBNRecord) -> None:
        bridge = self._bridge
        if bridge is None:
            return
        if isinstance(record, databento_dbn.MBP10Msg):
            bridge.put(bytes(record))
        elif isinstance(record, databento_dbn.SymbolMappingMsg):
            mapping = (int(record.instrument_id), str(record.stype_out_symbol))
            bridge.call(lambda: self._map_symbol(mapping))
        elif isinstance(record, databento_dbn.ErrorMsg):
            text = str(record.err)
            bridge.call(lambda: self._gateway_error(text))
        elif isinstance(record, databento_dbn.SystemMsg) and not record.is_heartbeat():
            log.info("%s: gateway: %s", self.name, record.msg)

    def _on_reconnect(self, gap_start: Any, gap_end: Any) -> None:
        gap = (_ns(gap_start), _ns(gap_end))
        if self._bridge is not None:
            self._bridge.call(lambda: self._report_reconnect(gap))

    def _on_callback_error(self, exc: Exception) -> None:
        log.error("%s: error in a live callback: %r", self.name, exc)

    # ------------------------------------------------------------ our loop

    def _on_drain(self, raw: bytes, records: int, dropped: int) -> None:
        if dropped:
            self.counters.dropped_records += dropped
            self._emit_health(
                HealthEvent(
                    HealthKind.DROPPED, time.time_ns(), "event loop fell behind the gateway", count=dropped
                )
            )
        if not records:
            return
        self.counters.messages += records
        self.counters.bytes += len(raw)
        before = self._decoder.counters.rejected_chunks
        decoded = self._decoder.feed(raw)
        if self._decoder.counters.rejected_chunks != before:
            self.counters.rejected_messages += 1
            self.counters.rejected_bytes += len(raw)
            self._emit_health(
                HealthEvent(HealthKind.REJECTED, time.time_ns(), str(self._decoder.last_error), 1, len(raw))
            )
            return
        self._emit_records(decoded)

    def _map_symbol(self, mapping: tuple[int, str]) -> None:
        instrument_id, symbol = mapping
        self.symbols[instrument_id] = symbol

    def _gateway_error(self, text: str) -> None:
        self.gateway_errors += 1
        log.error("%s: gateway error: %s", self.name, text)

    def _report_reconnect(self, gap: tuple[int, int]) -> None:
        down, up = gap
        now = time.time_ns()
        self.counters.reconnects += 1
        self.counters.gaps += 1
        log.warning("%s: reconnected; records between %d and %d ns are missing", self.name, down, up)
        self._emit_health(
            HealthEvent(
                HealthKind.RECONNECTED,
                now,
                "live session re-established",
                disconnected_at_ns=down,
                reconnected_at_ns=up,
            )
        )
        self._emit_health(
            HealthEvent(
                HealthKind.GAP,
                now,
                "records between the last one before the drop and the new session start are missing",
                disconnected_at_ns=down,
                reconnected_at_ns=up,
            )
        )
