"""The relay: publish a source (replay or Databento Live) onto the NATS market-data bus.

Each :class:`~feeds.sources.RecordBatch` is split by instrument and cut into messages of at most
``RelayConfig.batch_records`` records (:class:`~feeds.sources.nats_wire.MessageEncoder`), which
are published to JetStream on ``md.mbp10.<dataset>.<symbol>``; the stream
(``SourceConfig.stream``) is created if missing. Up to ``max_in_flight`` publishes await their
acknowledgement at once (one at a time is ~6k msgs/s on a 2-core machine, a window ~25k/s). A
publish whose acknowledgement does not come in time (the server restarted, say) is retried with
the same ``Nats-Msg-Id``, so JetStream stores it once; the relay keeps retrying while the server
is away (a replay source simply waits; a live source's bounded queue drops and counts). A
publish refused because no stream records the subject (the stream was deleted under the relay)
re-creates the stream, then is retried; each such episode is one warning.

**Resume.** At start the relay reads, for every subject it may publish to, the stream's last
message (JetStream's last message for the subject) and has its source skip the records of that
instrument up to and including the last record that message holds (by ``ts_recv``, then by the
record's bytes among records of that same ``ts_recv``: :mod:`feeds.sources.resume`), counting
them in ``skipped_records``. A relay restarted on the same files so carries on where the stream
stops instead of replaying from the start (which would send every consumer's clock back); a
paced replay drops those records before its pacing, so it publishes at once rather than after
as long as the previous run took; a live source, whose records are all newer, skips nothing.

**Stop.** When ``stop`` is set the relay stops reading its source (the batch being published
is finished), waits for the acknowledgements still in flight and returns. Whatever it waits on
(acknowledgements, retries, re-creating the stream, a connection that no longer moves), the
wait ends once ``RelayConfig.stop_timeout_s`` minus twice :data:`CLOSE_S` has passed since the
stop: what is still unacknowledged then is abandoned (logged and counted in
``abandoned_messages``; a relay restarted on the same files publishes it again, as it resumes
after the stream's last message), and the source and the connection are closed within
:data:`CLOSE_S` (a closed connection ends what was still waiting within as long again).

Records of an instrument with no known symbol (neither in the source's symbology nor in the
configured instruments) are counted in ``unknown_records`` and not published. The source's
health events are logged (consumers see outages through the ``Md-Seq`` header and the book's
sequence checks). A source whose own dataset (a replayed file's metadata) is not the configured
``feeds.source.dataset`` is published under its own, with a warning: consumers configured with
the other one would not see it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping

import nats.errors
import nats.js.errors
import numpy as np
from nats.js.api import PubAck

from feeds.config import RelayConfig
from feeds.dbn.framing import MBP10_SIZE
from feeds.errors import FeedError
from feeds.records import MBP10_DTYPE
from feeds.sources.base import Source
from feeds.sources.events import HealthEvent, RecordBatch, SourceEvent
from feeds.sources.nats_session import NatsSession
from feeds.sources.nats_wire import MessageEncoder, WireMessage
from feeds.sources.resume import ResumeFilter, ResumePoint
from feeds.sources.subjects import subject_for

__all__ = ["Relay", "RelayCounters"]

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 5.0
RETRY_DELAY_S = 0.25
CLOSE_S = 1.0
"""Of the stop timeout, what is kept for closing the source and the connection (and as long
again for the waits the closed connection ends)."""


@dataclasses.dataclass(slots=True)
class RelayCounters:
    """What a relay run did (records and messages acknowledged by JetStream)."""

    records: int = 0
    messages: int = 0
    bytes: int = 0
    unknown_records: int = 0
    skipped_records: int = 0
    """Records the stream already held (a restarted relay resumes after them)."""
    retries: int = 0
    abandoned_messages: int = 0
    """Messages still unacknowledged when the stop timeout ran out."""
    health_events: int = 0

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class _GaveUp(Exception):
    """The stop timeout ran out while publishes were still unacknowledged."""


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
        self._retrying: asyncio.Future[PubAck] | None = None
        self._give_up = asyncio.Event()
        self._failing = False
        self._resume = ResumeFilter(f"relay {source.name}", ())
        self._unknown_logged: set[int] = set()

    async def run(
        self, stop: asyncio.Event | None = None, progress: Callable[[RelayCounters], None] | None = None
    ) -> RelayCounters:
        """Relay until the source ends or ``stop`` is set; every publish is acknowledged (or
        retried) before returning, unless the stop timeout runs out first (see the module
        docstring). ``progress`` is called after each batch."""
        stop = stop or asyncio.Event()
        work = asyncio.create_task(self._work(stop, progress), name=f"relay {self.source.name}")
        try:
            await self._until_done_or_late(work, stop)
        finally:
            if not work.done():
                self._abandon(work)
            await self._close()
            if not work.done():
                await asyncio.wait({work}, timeout=CLOSE_S)  # a closed connection ends every wait
        failure = work.exception() if work.done() and not work.cancelled() else None
        self.counters.skipped_records = self._resume.skipped
        if self._give_up.is_set():
            self.counters.abandoned_messages = len(self._inflight)
            log.warning(
                "relay %s: stop timeout (%g s): %d message(s) left unacknowledged; a relay restarted "
                "on the same files publishes them again (it resumes after the stream's last message)",
                self.source.name,
                self.config.stop_timeout_s,
                self.counters.abandoned_messages,
            )
        elif failure is not None:
            raise failure
        log.info("relay %s: done (%s)", self.source.name, self.counters.snapshot())
        return self.counters

    async def _until_done_or_late(self, work: asyncio.Task[None], stop: asyncio.Event) -> None:
        """Until ``work`` ends, or ``stop_timeout_s - 2 * CLOSE_S`` after ``stop`` is set (then
        closing takes at most :data:`CLOSE_S`, and so does the end of ``work``)."""
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not work.done():
            await asyncio.wait({work}, timeout=max(0.0, self.config.stop_timeout_s - 2 * CLOSE_S))

    async def _work(self, stop: asyncio.Event, progress: Callable[[RelayCounters], None] | None) -> None:
        try:
            encoder = await self._open()
            await self._pump(encoder, stop, progress)
            while self._inflight:
                await self._settle_first()
        except _GaveUp:
            return

    async def _close(self) -> None:
        """Stop the source and close the connection, within :data:`CLOSE_S` together."""
        closing = asyncio.gather(self.source.stop(), self._session.close(CLOSE_S))
        try:
            await asyncio.wait_for(closing, CLOSE_S)
        except TimeoutError:
            log.warning("relay %s: closing took over %g s; leaving it", self.source.name, CLOSE_S)

    async def _open(self) -> MessageEncoder:
        """Connect, make sure the stream exists, start the source, read the resume points."""
        await self._session.connect()
        await self._session.ensure_stream(self.stream, self.config.stream_max_age_s)
        await self.source.start()
        encoder = MessageEncoder(self.source.dataset or self._dataset, self.config.batch_records)
        if encoder.dataset != self._dataset:
            log.warning(
                "relay %s: publishing dataset %s (the source's own) while feeds.source.dataset is %s: "
                'consumers with this configuration will not see it; set feeds.source.dataset = "%s" '
                "for them (TRADEAGENT__FEEDS__SOURCE__DATASET=%s)",
                self.source.name,
                encoder.dataset,
                self._dataset,
                encoder.dataset,
                encoder.dataset,
            )
        await self._read_resume_points(encoder.dataset)
        log.info("relay %s: publishing %s as relay %s", self.source.name, encoder.dataset, encoder.relay_id)
        return encoder

    async def _pump(
        self, encoder: MessageEncoder, stop: asyncio.Event, progress: Callable[[RelayCounters], None] | None
    ) -> None:
        stopper = asyncio.create_task(stop.wait())
        getter: asyncio.Task[SourceEvent | None] | None = None
        try:
            while not stop.is_set():
                getter = asyncio.create_task(self.source.next())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    return
                event, getter = getter.result(), None
                if event is None:
                    return
                if isinstance(event, HealthEvent):
                    self.counters.health_events += 1
                    log.warning("relay %s: %s %s", self.source.name, event.kind, event.detail)
                    continue
                await self._relay(encoder, event)
                if progress is not None:
                    progress(self.counters)
        finally:
            stopper.cancel()
            if getter is not None:
                getter.cancel()

    # ----------------------------------------------------------------- resume

    async def _read_resume_points(self, dataset: str) -> None:
        """The stream's last record of every instrument this relay may publish, handed to the
        source (:meth:`feeds.sources.Source.resume_after`)."""
        js = self._session.js
        symbols = {**self._fallback_symbols, **self.source.symbols}
        points: list[ResumePoint] = []
        for instrument_id, symbol in sorted(symbols.items()):
            try:
                subject = subject_for(dataset, symbol)
            except FeedError:
                continue  # never published (the encoder refuses the name too)
            try:
                msg = await self._session.retry(functools.partial(js.get_last_msg, self.stream, subject))
            except nats.js.errors.NotFoundError:
                continue
            data = msg.data or b""
            if not data or len(data) % MBP10_SIZE:
                continue  # not whole records: nothing to resume from
            last = np.frombuffer(data[-MBP10_SIZE:], dtype=MBP10_DTYPE)
            if int(last["instrument_id"][0]) != instrument_id:
                continue  # the symbol's instrument changed: a different feed
            points.append(ResumePoint(instrument_id, symbol, int(last["ts_recv"][0]), data[-MBP10_SIZE:]))
        if points:
            log.info(
                "relay %s: resuming after the stream's last records: %s",
                self.source.name,
                ", ".join(f"{p.symbol} at ts_recv {p.ts_recv}" for p in points),
            )
            self._resume = ResumeFilter(f"relay {self.source.name}", points)
            self.source.resume_after(self._resume)

    # ----------------------------------------------------------------- publishing

    async def _relay(self, encoder: MessageEncoder, batch: RecordBatch) -> None:
        self.counters.skipped_records = self._resume.skipped
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
        future = await self._send(message)
        self._inflight.append((message, future))
        while len(self._inflight) >= self.config.max_in_flight:
            await self._settle_first()

    async def _send(self, message: WireMessage) -> asyncio.Future[PubAck]:
        """Hand ``message`` to the client, retrying until it takes it; its acknowledgement."""
        js = self._session.js
        while True:
            if self._give_up.is_set():
                raise _GaveUp
            try:
                return await js.publish_async(
                    message.subject, message.payload, headers=dict(message.headers), wait_stall=ACK_TIMEOUT_S
                )
            except (nats.errors.Error, OSError) as exc:
                self.counters.retries += 1
                log.debug("relay: publish failed (%r); retrying", exc)
                await self._pause(exc)

    async def _settle_first(self) -> None:
        """Wait for the oldest acknowledgement; republish (same message id) until JetStream has
        it. The message stays in flight (counted as abandoned if the stop timeout runs out)."""
        message, future = self._inflight[0]
        try:
            await self._acknowledged(future)
        except (TimeoutError, nats.errors.Error) as exc:
            self._report_failing(message, exc)
            await self._republish(message)
        else:
            if self._failing:  # a first attempt went through: the episode is over
                self._failing = False
                log.info("relay: JetStream acknowledges publishes again")
        self._inflight.popleft()
        self.counters.messages += 1
        self.counters.records += message.records
        self.counters.bytes += len(message.payload)

    async def _republish(self, message: WireMessage) -> None:
        while True:
            self.counters.retries += 1
            self._retrying = await self._send(message)
            try:
                await self._acknowledged(self._retrying)
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("relay: republish failed (%r); retrying", exc)
                await self._pause(exc)
                continue
            finally:
                self._retrying = None
            return

    async def _acknowledged(self, future: asyncio.Future[PubAck]) -> None:
        """Wait for ``future`` (at most :data:`ACK_TIMEOUT_S`); :class:`_GaveUp` when the stop
        timeout ran out."""
        if self._give_up.is_set():
            raise _GaveUp
        try:
            await asyncio.wait_for(future, ACK_TIMEOUT_S)
        except asyncio.CancelledError:
            if future.cancelled() and self._give_up.is_set():
                raise _GaveUp from None
            raise

    def _report_failing(self, message: WireMessage, exc: BaseException) -> None:
        """One warning per episode of failing publishes."""
        if self._failing:
            return
        self._failing = True
        if isinstance(exc, nats.js.errors.NoStreamResponseError):
            reason = f"no JetStream stream records {message.subject} (stream {self.stream} deleted?)"
            remedy = "re-creating the stream and republishing"
        else:
            reason, remedy = f"no acknowledgement for {message.subject} ({exc!r})", "republishing"
        log.warning("relay: %s; %s until it succeeds", reason, remedy)

    async def _pause(self, exc: BaseException) -> None:
        """Between two attempts: re-create a missing stream, wait :data:`RETRY_DELAY_S`;
        :class:`_GaveUp` once the stop timeout ran out."""
        if isinstance(exc, nats.js.errors.NoStreamResponseError):
            try:
                await self._session.ensure_stream(self.stream, self.config.stream_max_age_s)
            except FeedError as failure:
                log.debug("relay: cannot re-create stream %s yet: %s", self.stream, failure)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._give_up.wait(), RETRY_DELAY_S)
        if self._give_up.is_set():
            raise _GaveUp

    # ----------------------------------------------------------------- stop

    def _abandon(self, work: asyncio.Task[None]) -> None:
        """The stop timeout ran out: end every wait of ``work``. Its acknowledgements are
        cancelled (:meth:`_acknowledged` turns that into :class:`_GaveUp`) and so is the task
        (nats-py may swallow one cancellation: every wait checks the flag first)."""
        self._give_up.set()
        futures = [future for _, future in self._inflight]
        if self._retrying is not None:
            futures.append(self._retrying)
        for future in futures:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: no "never retrieved" report at collection
        work.cancel()
