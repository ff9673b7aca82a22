"""The NATS market-data source: core subscriptions or a JetStream pull consumer.

Subjects are ``md.mbp10.<dataset>.<symbol>`` (:mod:`feeds.sources.subjects`); payloads are bare
MBP-10 record bytes (:mod:`feeds.sources.nats_wire`), decoded by :class:`feeds.dbn.StreamDecoder`
(``"message"`` framing): a payload that is not whole MBP-10 records is counted
(``counters.rejected_messages``/``rejected_bytes``), reported as a ``REJECTED`` health event and
dropped; it never raises.

Modes (``SourceConfig.nats_mode``):

``jetstream`` (default)
    A pull consumer on the stream (``SourceConfig.stream``, created if missing), filtered on the
    configured subjects, acknowledging with ``AckPolicy.ALL``. One pull request for up to
    ``fetch_batch`` messages is kept open at a time and its messages are taken as they arrive (a
    callback on this source's own inbox; the messages of one transport read together, their
    payloads checked as one buffer), the next request going out as soon as the last one is
    served or ends, with the acknowledgement of what the last one brought (``ack="receipt"``)
    in the same socket write: at real-time pace a request carries many messages, where a plain
    ``fetch`` costs a no-wait probe, a waiting request and a status message per message, and
    an acknowledgement per read would cost a write per read. With a ``durable``
    name it resumes where it stopped (and a new durable starts at the beginning of the stream);
    without one it is an ephemeral consumer that starts with new messages. Redeliveries are
    recognised by stream sequence and skipped (``counters.duplicates``): processing is idempotent.
    After a reconnect the consumer is looked up again and, if the server lost it (an ephemeral
    consumer times out during a long outage), re-created to start right after the last stream
    sequence seen, so nothing retained by the stream is missed. A request never asks for more
    messages than the queue has room for, so a full queue pauses fetching (JetStream keeps the
    messages) instead of dropping.
``core``
    Plain subscriptions: lowest latency, at-most-once. Messages published while disconnected are
    lost; the relay's per-subject ``Md-Seq`` header tells exactly how many, reported as a
    ``GAP`` event carrying the outage interval. Messages the client itself drops as a slow
    consumer (its pending limits) surface the same way, as ``Md-Seq`` gaps. A full queue drops
    batches (counted, ``DROPPED``).

Every disconnect is reported as ``DISCONNECTED`` and every reconnect as ``RECONNECTED``
(``disconnected_at_ns``/``reconnected_at_ns``) once the subscriptions are re-established.

What does not match the configuration never reaches the consumer. A durable consumer found on
the server with another filter than the configured subjects (the daemon restarted with another
``feeds.source.dataset`` or ``symbols`` on the same ``durable``) is deleted and re-created on the
configured subjects, delivering from the start of the stream as a new durable does (its
position was one in another feed), with a warning naming the durable and its old filter. A
JetStream consumer filtered on several subjects (``symbols`` given) needs nats-server 2.10: an
older server ignores the filter and delivers every dataset of the stream, so
:meth:`NatsSource.start` refuses it, naming the server's version, the stream and the subjects.
Every message's subject is checked again on receipt
(:class:`~feeds.sources.subjects.SubjectFilter`): one of another dataset or symbol is counted
(``rejected_dataset_records``/``rejected_instrument_records``, its payload's records) and
reported once per dataset or symbol as ``MISMATCH``, never decoded. Its detail says why it came,
from the consumer's filter as the server holds it then: the configured one (the server did not
apply it: an old server), none (re-created without one by another configuration, or dropped by
an old server) or another one (another configuration re-created the durable under this
source). While the feed is stale
the stream is asked, every ``stale_after_s``, which subjects it holds: if none is this feed's
but others are (a relay publishing ``SYNTH`` to a daemon configured for ``GLBX.MDP3``), a
``MISMATCH`` event, once per stale episode, names the datasets it holds and the remedy.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Literal, cast

import nats.errors
import nats.js.errors
import numpy as np
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from feeds.dbn import StreamDecoder
from feeds.dbn.framing import MBP10_SIZE
from feeds.errors import FeedError
from feeds.sources.base import QueuedSource
from feeds.sources.events import HealthEvent, HealthKind
from feeds.sources.nats_session import MULTI_FILTER_VERSION, NatsSession, NatsUnavailable
from feeds.sources.nats_wire import SequenceTracker, parse_tags, stream_sequence, whole_records
from feeds.sources.subjects import SUBJECT_ROOT, SubjectFilter, dataset_subjects, subject_dataset

__all__ = ["NatsSource", "consumer_filter"]

log = logging.getLogger(__name__)

ACK_WAIT_S = 30.0
MAX_ACK_PENDING = 20_000
EPHEMERAL_INACTIVE_S = 60.0
PULL_EXPIRES_S = 1.0
"""A pull request expires after this long without being served in full (then the next goes out)."""
EXPLAIN_TIMEOUT_S = 2.0
"""How long a refusal's report waits for the consumer's filter from the server."""
CORE_PENDING_MSGS = 65_536
CORE_PENDING_BYTES = 512 * 1024 * 1024
_HEARTBEAT = "100"


def consumer_filter(config: ConsumerConfig) -> tuple[str, ...]:
    """The subjects a consumer's configuration filters on (empty: every subject of the stream)."""
    if config.filter_subjects:
        return tuple(config.filter_subjects)
    return (config.filter_subject,) if config.filter_subject else ()


class NatsSource(QueuedSource):
    """MBP-10 records from NATS (see the module docstring for the modes).

    ``ack="receipt"`` acknowledges what a pull request brought once its records are queued, with
    the next request (a daemon: at most ``fetch_batch`` messages, or a request's expiry, are
    unacknowledged, and redelivered to the next process if this one dies);
    ``ack="manual"`` leaves it to the consumer, which calls :meth:`ack_through` once the records
    are safe (the recorder, after its file flush).
    """

    def __init__(
        self,
        *,
        url: str,
        dataset: str,
        symbols: tuple[str, ...] = (),
        mode: Literal["jetstream", "core"] = "jetstream",
        stream: str = "MBP10",
        durable: str = "",
        stream_max_age_s: float = 7 * 86400.0,
        fetch_batch: int = 64,
        max_batches: int = 1024,
        stale_after_s: float = 5.0,
        ack: Literal["receipt", "manual"] = "receipt",
        instruments: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(
            f"nats:{mode}:{dataset}",
            max_batches=max_batches,
            stale_after_s=stale_after_s,
            instruments=instruments,
        )
        self.dataset = dataset
        self.subjects = dataset_subjects(dataset, symbols)
        self._filter = SubjectFilter(dataset, symbols)
        self._probe: asyncio.Task[None] | None = None
        self._named_episode = 0
        """The stale episode (``counters.stale``) whose mismatch was named."""
        self.mode = mode
        self.stream = stream
        self.durable = durable
        self._stream_max_age_s = stream_max_age_s
        self._fetch_batch = fetch_batch
        self._ack = ack
        self.last_stream_seq = 0
        """Highest JetStream stream sequence taken in (duplicates at or below it are skipped)."""
        self._session = NatsSession(
            url, f"tradeagent-{self.name}", on_disconnect=self._on_disconnect, on_reconnect=self._on_reconnect
        )
        self._decoder = StreamDecoder(framing="message")
        self._tracker = SequenceTracker()
        self._core_subs: list[Subscription] = []
        self._inbox_sub: Subscription | None = None
        self._consumer = durable or f"eph-{secrets.token_hex(6)}"
        self._pull_task: asyncio.Task[None] | None = None
        self._asked = 0
        """Messages the open pull request asked for; ``_served`` of them have arrived."""
        self._served = 0
        self._request_over = asyncio.Event()
        self._resubscribe = False
        self._outage: tuple[int, int] | None = None
        self._unacked: collections.deque[tuple[int, Msg]] = collections.deque()
        self._arrived: list[Msg] = []
        """Stream messages received and not taken in yet (the rest of their read is coming,
        within the same step of the subscription task)."""
        self._server_filter: tuple[str, ...] = ()
        """The consumer's filter as the server answered when it was last bound."""
        self._explaining: set[asyncio.Task[None]] = set()
        """Lookups of the consumer's filter for a refusal's detail (:meth:`_explain_refusal`)."""

    async def _start(self) -> None:
        await self._session.connect()
        if self.mode == "core":
            client = self._session.client
            for subject in self.subjects:
                sub = await client.subscribe(
                    subject,
                    cb=self._on_core_msg,
                    pending_msgs_limit=CORE_PENDING_MSGS,
                    pending_bytes_limit=CORE_PENDING_BYTES,
                )
                self._core_subs.append(sub)
            await self._session.confirm_commands()
        else:
            if len(self.subjects) > 1:
                self._session.require_version(
                    MULTI_FILTER_VERSION,
                    f"a JetStream consumer on stream {self.stream} filtered on {', '.join(self.subjects)} "
                    "needs (an older server ignores the filter and delivers every dataset)",
                    "upgrade nats-server, or set feeds.source.symbols = [] (one filter: "
                    f"{SUBJECT_ROOT}.{self._filter.dataset_token}.>)",
                )
            await self._session.ensure_stream(self.stream, self._stream_max_age_s)
            await self._bind_consumer()
            self._pull_task = asyncio.create_task(self._pull_loop(), name=f"{self.name}-pull")
        log.info("%s: subscribed to %s", self.name, self.subjects)

    async def _stop(self) -> None:
        for task in (self._pull_task, self._probe, *self._explaining):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._pull_task = self._probe = None
        if self._unacked and self._ack == "receipt":
            await self._ack_msg(self._unacked[-1][1])
        await self._session.close()

    # ----------------------------------------------------------------- JetStream consumer

    def _consumer_config(self, start_seq: int | None) -> ConsumerConfig:
        if start_seq is not None:
            deliver, opt_seq = DeliverPolicy.BY_START_SEQUENCE, start_seq
        else:
            deliver, opt_seq = (DeliverPolicy.ALL if self.durable else DeliverPolicy.NEW), None
        filters = self.subjects
        return ConsumerConfig(
            name=self._consumer,
            durable_name=self.durable or None,
            deliver_policy=deliver,
            opt_start_seq=opt_seq,
            ack_policy=AckPolicy.ALL,
            ack_wait=ACK_WAIT_S,
            max_ack_pending=MAX_ACK_PENDING,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            inactive_threshold=None if self.durable else EPHEMERAL_INACTIVE_S,
        )

    async def _bind_consumer(self) -> None:
        """Find the consumer (or create it) and bind a pull subscription to it.

        A consumer filtered on other subjects than the configured ones (a durable of another
        dataset or symbol set: the configuration changed, or another one shares the name) is
        deleted and created anew on the configured subjects, as a new consumer: its position
        belonged to another feed (a warning names the durable and its old filter). Messages the
        server delivered but nobody acknowledged (to a process that died, or lost in flight
        during an outage) would only come back after ``ack_wait`` and out of stream order. So
        when the consumer has any, it is re-created to deliver again from its acknowledgement
        floor, in order; what this process already took in is then skipped as duplicates by
        stream sequence.
        """
        session = self._session
        js = session.js
        fresh = self.last_stream_seq + 1 if self.last_stream_seq else None
        create, start = False, None
        try:
            info = await session.retry(lambda: js.consumer_info(self.stream, self._consumer))
        except nats.js.errors.NotFoundError:
            create, start = True, fresh
        else:
            held = consumer_filter(info.config)
            if set(held) != set(self.subjects):
                create, start = True, fresh
                log.warning(
                    "%s: consumer %s on stream %s is filtered on %s, not on the configured %s "
                    "(another feeds.source.dataset or symbols used it): re-creating it on the "
                    "configured subjects, delivering %s",
                    self.name,
                    self._consumer,
                    self.stream,
                    ", ".join(held) or "no subject (the whole stream)",
                    ", ".join(self.subjects),
                    f"after stream sequence {self.last_stream_seq}"
                    if fresh
                    else ("from the start of the stream" if self.durable else "new messages"),
                )
            elif info.num_ack_pending:
                floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
                create, start = True, int(floor or 0) + 1
            else:
                self._server_filter = held
            if create:
                await session.retry(lambda: js.delete_consumer(self.stream, self._consumer))
        if create:
            config = self._consumer_config(start)
            created = await session.retry(lambda: js.add_consumer(self.stream, config=config))
            self._server_filter = consumer_filter(created.config)
            self._unacked.clear()  # handles of a previous consumer cannot be acknowledged
            log.info(
                "%s: consumer %s (re)created, delivering from %s",
                self.name,
                self._consumer,
                start or config.deliver_policy,
            )
        old, self._inbox_sub = self._inbox_sub, None
        if old is not None:
            with contextlib.suppress(nats.errors.Error, ValueError):
                await old.unsubscribe()
        client = session.client
        self._inbox_sub = await client.subscribe(
            client.new_inbox(),
            cb=self._on_pull_msg,
            pending_msgs_limit=CORE_PENDING_MSGS,
            pending_bytes_limit=CORE_PENDING_BYTES,
        )
        self._request_over.set()  # a request made to an earlier inbox is void

    async def _pull_loop(self) -> None:
        """Keep one pull request open: ask for as many messages as the queue has room for (at
        most ``fetch_batch``), then wait until they have all arrived, the request expired or the
        consumer was re-bound (:meth:`_on_pull_msg` says so). With ``ack="receipt"`` what the
        request brought is acknowledged (one acknowledgement, of its last message) right
        before the next request goes out: both leave in one socket write."""
        try:
            while True:
                if self._resubscribe:
                    self._resubscribe = False
                    await self._bind_consumer()
                    self._report_reconnected()
                if self._ack == "receipt" and self._unacked:
                    last = self._unacked[-1][1]
                    self._unacked.clear()
                    await self._ack_msg(last)
                await self._wait_for_room()
                sub = self._inbox_sub
                assert sub is not None
                self._asked = min(self._fetch_batch, self._max_batches - self._queued_batches)
                self._served = 0
                self._request_over.clear()
                request = {"batch": self._asked, "expires": int(PULL_EXPIRES_S * 1e9)}
                try:
                    await self._session.client.publish(
                        f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self._consumer}",
                        json.dumps(request).encode(),
                        reply=sub.subject,
                    )
                except nats.errors.Error as exc:
                    if self._session.client.is_closed:
                        raise NatsUnavailable(f"{self.name}: connection closed") from exc
                    log.debug("%s: pull request failed (%r); retrying", self.name, exc)
                    await asyncio.sleep(0.1)
                    continue
                # A request lost with the connection ends with the reconnect (or, at the latest,
                # after its expiry plus a margin).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._request_over.wait(), PULL_EXPIRES_S + 1.0)
        except FeedError as exc:
            self._finish(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s: pull loop failed", self.name)
            self._finish(FeedError(f"{self.name}: pull loop failed: {exc!r}"))

    async def _on_pull_msg(self, msg: Msg) -> None:
        """A message on the inbox: a stream message, or a status that ends the request (408:
        expired, 409: the server ended it) or only keeps it alive (100: heartbeat). Stream
        messages are held until the inbox has none waiting (the rest of one transport read),
        then taken in together (:meth:`_take_arrived`). nats-py calls this for every message
        waiting in one step of its subscription task (this never suspends), so nothing is held
        when another task runs."""
        try:
            status = JetStreamContext.is_status_msg(msg)
            if status is None:
                self._arrived.append(msg)
                self._served += 1
                sub = self._inbox_sub
                if sub is not None and sub.pending_msgs:
                    return
            self._take_arrived()
            if (status is not None and status != _HEARTBEAT) or self._served >= self._asked:
                self._request_over.set()
        except Exception as exc:
            log.exception("%s: taking a JetStream message failed", self.name)
            self._finish(FeedError(f"{self.name}: taking a JetStream message failed: {exc!r}"))

    def _take_arrived(self) -> None:
        """Take in the stream messages held (:meth:`_on_pull_msg`), in order; redeliveries of
        what was taken in already are skipped by stream sequence."""
        arrived, self._arrived = self._arrived, []
        if not arrived:
            return
        decoded = whole_records([msg.data for msg in arrived])
        for msg, records in zip(arrived, decoded, strict=True):
            seq = stream_sequence(msg.reply)
            if seq is not None:
                self._unacked.append((seq, msg))
                if seq <= self.last_stream_seq:
                    self.counters.duplicates += 1
                    continue
                self.last_stream_seq = seq
            self._take(msg.subject, msg.data, msg.headers, seq, records)

    async def ack_through(self, stream_seq: int) -> None:
        """Acknowledge every received message up to ``stream_seq`` (``ack="manual"``)."""
        last: Msg | None = None
        while self._unacked and self._unacked[0][0] <= stream_seq:
            last = self._unacked.popleft()[1]
        if last is not None:
            await self._ack_msg(last)

    async def _ack_msg(self, msg: Msg) -> None:
        try:
            await msg.ack()
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            # The message will be redelivered and skipped as a duplicate.
            log.debug("%s: ack failed: %r", self.name, exc)

    # ----------------------------------------------------------------- core subscriptions

    async def _on_core_msg(self, msg: Msg) -> None:
        self._take(msg.subject, msg.data, msg.headers, None, whole_records([msg.data])[0])

    # ----------------------------------------------------------------- shared

    def _take(
        self,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None,
        seq: int | None,
        records: np.ndarray | None,
    ) -> None:
        """One message: checked (subject, relay sequence) and its records queued: ``records``
        when it is whole MBP-10 records (:func:`whole_records`), else what the decoder makes of
        it (a rejection, counted and reported, or the MBP-10 records among other types)."""
        counters = self.counters
        counters.messages += 1
        counters.bytes += len(data)
        mismatch = self._filter.mismatch(subject)
        if mismatch is not None:
            self._refuse_subject(subject, mismatch, len(data) // MBP10_SIZE)
            return
        tags = parse_tags(headers)
        missing, repeat = self._tracker.observe(subject, tags)
        if repeat:
            counters.duplicates += 1
            return
        if missing:
            self._report_gap(subject, missing)
        if records is not None:
            self._emit_records(records, seq, tags.part)
            return
        decoder = self._decoder
        rejected_before = decoder.counters.rejected_chunks
        records = decoder.feed(data)
        if decoder.counters.rejected_chunks != rejected_before:
            counters.rejected_messages += 1
            counters.rejected_bytes += len(data)
            log.warning(
                "%s: rejected a %d-byte message on %s: %s", self.name, len(data), subject, decoder.last_error
            )
            self._emit_health(
                HealthEvent(
                    HealthKind.REJECTED,
                    time.time_ns(),
                    f"{subject}: {decoder.last_error}",
                    count=1,
                    bytes=len(data),
                )
            )
            return
        self._emit_records(records, seq, tags.part)

    def _refuse_subject(self, subject: str, what: Literal["dataset", "symbol"], records: int) -> None:
        """A message outside this source's subjects: counted; the first of its dataset or symbol
        is reported, a JetStream consumer's after a look at its filter on the server
        (:meth:`_explain_refusal`), which says why it came."""
        kind: Literal["dataset", "instrument"] = "dataset" if what == "dataset" else "instrument"
        token = subject_dataset(subject) if what == "dataset" else subject.rsplit(".", 1)[-1]
        key = f"{what}:{token}"
        if not self._count_refused(kind, key, records):
            return
        if self.mode == "core":
            reason = "the server delivered it outside this source's subscriptions"
            detail = self._refusal_detail(subject, what, token, reason)
            self._emit_health(self._refusal(kind, key, records, detail))
            return
        task = asyncio.get_running_loop().create_task(
            self._explain_refusal(subject, what, token, records), name=f"{self.name}-refusal"
        )
        self._explaining.add(task)
        task.add_done_callback(self._explaining.discard)

    async def _explain_refusal(
        self, subject: str, what: Literal["dataset", "symbol"], token: str, records: int
    ) -> None:
        """Report the first refused message of a dataset or symbol with why the consumer
        delivered it: its filter as the server holds it now is the configured one (the server
        did not apply it: only then is its version blamed), none (another configuration
        re-created the durable without one, or an old server dropped it: both named) or another
        one (another configuration re-created the durable: named)."""
        try:
            info = await asyncio.wait_for(
                self._session.js.consumer_info(self.stream, self._consumer), EXPLAIN_TIMEOUT_S
            )
        except (TimeoutError, FeedError, nats.errors.Error, nats.js.errors.Error) as exc:
            log.debug("%s: cannot look up consumer %s: %r", self.name, self._consumer, exc)
            held = self._server_filter
        else:
            held = consumer_filter(info.config)
        try:
            found = self._session.server_version
        except FeedError:  # closed meanwhile
            found = None
        version = ".".join(map(str, found)) if found is not None else "an unknown version"
        if set(held) == set(self.subjects):
            reason = (
                f"consumer {self._consumer} is filtered on these subjects, yet the server did not apply "
                f"the filter (nats-server before 2.10 ignores a multi-subject filter; this one "
                f"announces {version}): upgrade it"
            )
        elif not held:
            reason = (
                f"the server holds consumer {self._consumer} with no filter: another configuration "
                "re-created it without one (give each configuration its own feeds.source.durable), "
                f"or the server dropped the one it was given (nats-server before 2.10 does; this one "
                f"announces {version})"
            )
        else:
            reason = (
                f"consumer {self._consumer} on stream {self.stream} is now filtered on {', '.join(held)}: "
                "another configuration re-created it; give each configuration its own feeds.source.durable"
            )
        kind: Literal["dataset", "instrument"] = "dataset" if what == "dataset" else "instrument"
        detail = self._refusal_detail(subject, what, token, reason)
        self._emit_health(self._refusal(kind, f"{what}:{token}", records, detail))

    def _refusal_detail(self, subject: str, what: str, token: str, reason: str) -> str:
        return (
            f"NATS subject {subject} is not one of {', '.join(self.subjects)} ({what} {token}): its "
            f"records are counted and never traded; {reason}"
        )

    @property
    def _stale_episode(self) -> int:
        """The number of the stale episode going on (or, before its event, starting)."""
        return self.counters.stale + (0 if self._stale else 1)

    def _on_stale(self) -> None:
        if self._named_episode != self._stale_episode and (self._probe is None or self._probe.done()):
            self._probe = asyncio.get_running_loop().create_task(
                self._probe_stream(), name=f"{self.name}-probe"
            )

    async def _probe_stream(self) -> None:
        """The feed is stale: if the stream holds messages, none of them on this feed's
        subjects, say which datasets it holds instead (a ``MISMATCH`` event, once per stale
        episode; asked again each ``stale_after_s`` until then: the publisher may start late)."""
        js = self._session.js
        try:
            info = await js.stream_info(self.stream, subjects_filter=f"{SUBJECT_ROOT}.>")
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
            log.debug("%s: cannot look into stream %s: %r", self.name, self.stream, exc)
            return
        held = cast("dict[str, int]", info.state.subjects or {})
        if not held or any(self._filter.mismatch(subject) is None for subject in held):
            return
        datasets = sorted({subject_dataset(subject) for subject in held})
        examples = ", ".join(sorted(held)[:4])
        detail = (
            f"no data on {', '.join(self.subjects)}: stream {self.stream} holds messages of dataset "
            f"{', '.join(datasets)} ({examples}{', ...' if len(held) > 4 else ''}) but none on "
            f"this feed's subjects (dataset {self.dataset}); set feeds.source.dataset (and "
            "feeds.source.symbols) to what the relay publishes, or relay data of "
            f"{self.dataset}"
        )
        self._named_episode = self._stale_episode
        log.warning("%s: %s", self.name, detail)
        self._emit_health(HealthEvent(HealthKind.MISMATCH, time.time_ns(), detail))

    def _report_gap(self, subject: str, missing: int) -> None:
        self.counters.gaps += 1
        down, up = self._outage if self._outage is not None else (None, None)
        log.warning("%s: %d messages missing on %s", self.name, missing, subject)
        self._emit_health(
            HealthEvent(
                HealthKind.GAP,
                time.time_ns(),
                f"{subject}: {missing} messages missing",
                count=missing,
                disconnected_at_ns=down,
                reconnected_at_ns=up,
                sequence_gap=missing,
            )
        )

    def _on_disconnect(self, at_ns: int) -> None:
        self.counters.disconnects += 1
        self._emit_health(
            HealthEvent(HealthKind.DISCONNECTED, at_ns, "NATS connection lost", disconnected_at_ns=at_ns)
        )

    async def _on_reconnect(self, disconnected_at_ns: int, reconnected_at_ns: int) -> None:
        self._outage = (disconnected_at_ns, reconnected_at_ns)
        self._decoder.reset()
        if self.mode == "core":
            self._report_reconnected()  # nats-py has re-sent every core subscription
        else:
            self._resubscribe = True  # the pull loop re-binds the consumer, then reports
            self._request_over.set()

    def _report_reconnected(self) -> None:
        assert self._outage is not None
        down, up = self._outage
        self.counters.reconnects += 1
        detail = (
            "subscriptions re-established; core NATS loses messages published during the outage"
            if self.mode == "core"
            else f"consumer {self._consumer} re-established after stream sequence {self.last_stream_seq}"
        )
        self._emit_health(
            HealthEvent(
                HealthKind.RECONNECTED,
                time.time_ns(),
                detail,
                disconnected_at_ns=down,
                reconnected_at_ns=up,
            )
        )
