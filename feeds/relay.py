"""The relay: publish a source (replay or Databento Live) onto the NATS market-data bus.

Each :class:`~feeds.sources.RecordBatch` is split by instrument and cut into messages of at most
``RelayConfig.batch_records`` records (:class:`~feeds.sources.nats_wire.MessageEncoder`), which
are published to JetStream on ``md.mbp10.<dataset>.<symbol>``; the stream
(``SourceConfig.stream``) is created if missing. Up to ``max_in_flight`` publishes await their
acknowledgement at once (one at a time is ~6k msgs/s on a 2-core machine, a window ~25k/s). A
publish whose acknowledgement does not come in time (the server restarted, say) is retried with
the same ``Nats-Msg-Id``, so JetStream stores it once; the relay keeps retrying while the server
is away (a replay source simply waits; a live source's bounded queue drops and counts).

Records of an instrument with no known symbol (neither in the source's symbology nor in the
configured instruments) are counted in ``unknown_records`` and not published. The source's
health events are logged (consumers see outages through the ``Md-Seq`` header and the book's
sequence checks).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable, Mapping

import nats.errors
import nats.js.errors
from nats.js.api import PubAck

from feeds.config import RelayConfig
from feeds.sources.base import Source
from feeds.sources.events import HealthEvent, RecordBatch
from feeds.sources.nats_session import NatsSession
from feeds.sources.nats_wire import MessageEncoder, WireMessage

__all__ = ["Relay", "RelayCounters"]

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 5.0
RETRY_DELAY_S = 0.25


@dataclasses.dataclass(slots=True)
class RelayCounters:
    """What a relay run did (records and messages acknowledged by JetStream)."""

    records: int = 0
    messages: int = 0
    bytes: int = 0
    unknown_records: int = 0
    retries: int = 0
    health_events: int = 0

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class Relay:
    """Publish ``source`` onto NATS at ``url`` (see the module docstring).

    ``dataset`` is used when the source does not know its own (replay files carry it in their
    metadata); ``symbols`` (instrument_id -> symbol) completes the source's own symbology.
    """

    def __init__(
        self,
        source: Source,
        *,
        url: str,
        stream: str,
        dataset: str,
        symbols: Mapping[int, str],
        config: RelayConfig,
    ) -> None:
        self.source = source
        self.stream = stream
        self.config = config
        self.counters = RelayCounters()
        self._dataset = dataset
        self._fallback_symbols = dict(symbols)
        self._session = NatsSession(url, "tradeagent-relay")
        self._inflight: collections.deque[tuple[WireMessage, asyncio.Future[PubAck]]] = collections.deque()
        self._unknown_logged: set[int] = set()

    async def run(
        self, stop: asyncio.Event | None = None, progress: Callable[[RelayCounters], None] | None = None
    ) -> RelayCounters:
        """Relay until the source ends or ``stop`` is set; every publish is acknowledged (or
        retried) before returning. ``progress`` is called after each batch."""
        stop = stop or asyncio.Event()
        await self._session.connect()
        try:
            await self._session.ensure_stream(self.stream, self.config.stream_max_age_s)
            await self.source.start()
            encoder = MessageEncoder(self.source.dataset or self._dataset, self.config.batch_records)
            log.info(
                "relay %s: publishing %s as relay %s", self.source.name, encoder.dataset, encoder.relay_id
            )
            stopper = asyncio.create_task(stop.wait())
            try:
                while not stop.is_set():
                    getter = asyncio.create_task(self.source.next())
                    done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if getter not in done:
                        getter.cancel()
                        break
                    event = getter.result()
                    if event is None:
                        break
                    if isinstance(event, HealthEvent):
                        self.counters.health_events += 1
                        log.warning("relay %s: %s %s", self.source.name, event.kind, event.detail)
                        continue
                    await self._relay(encoder, event)
                    if progress is not None:
                        progress(self.counters)
                while self._inflight:
                    await self._settle(*self._inflight.popleft())
            finally:
                stopper.cancel()
        finally:
            await self.source.stop()
            await self._session.close()
        log.info("relay %s: done (%s)", self.source.name, self.counters.snapshot())
        return self.counters

    async def _relay(self, encoder: MessageEncoder, batch: RecordBatch) -> None:
        symbols = {**self._fallback_symbols, **self.source.symbols}
        messages, unknown = encoder.encode(batch.records, symbols)
        if len(unknown):
            self.counters.unknown_records += len(unknown)
            for instrument_id in set(unknown["instrument_id"].tolist()) - self._unknown_logged:
                self._unknown_logged.add(instrument_id)
                log.warning(
                    "relay: instrument %d has no symbol; its records are not published", instrument_id
                )
        for message in messages:
            await self._publish(message)

    async def _publish(self, message: WireMessage) -> None:
        js = self._session.js
        while True:
            try:
                future = await js.publish_async(
                    message.subject, message.payload, headers=dict(message.headers)
                )
                break
            except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                self.counters.retries += 1
                log.debug("relay: publish failed (%r); retrying", exc)
                await asyncio.sleep(RETRY_DELAY_S)
        self._inflight.append((message, future))
        while len(self._inflight) >= self.config.max_in_flight:
            await self._settle(*self._inflight.popleft())

    async def _settle(self, message: WireMessage, future: asyncio.Future[PubAck]) -> None:
        """Wait for one acknowledgement; republish (same message id) until JetStream has it."""
        try:
            await asyncio.wait_for(future, ACK_TIMEOUT_S)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
            log.warning("relay: no acknowledgement for %s (%r); republishing", message.subject, exc)
            await self._republish(message)
        self.counters.messages += 1
        self.counters.records += message.records
        self.counters.bytes += len(message.payload)

    async def _republish(self, message: WireMessage) -> None:
        js = self._session.js
        while True:
            self.counters.retries += 1
            try:
                await js.publish(
                    message.subject, message.payload, timeout=ACK_TIMEOUT_S, headers=dict(message.headers)
                )
                return
            except (TimeoutError, nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                log.debug("relay: republish failed (%r); retrying", exc)
                await asyncio.sleep(RETRY_DELAY_S)
