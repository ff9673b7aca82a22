"""One NATS connection with its reconnect bookkeeping and the JetStream stream of the bus.

This is the session layer of the NATS feed (STYLE item 1): it owns the ``nats.aio`` client,
turns its disconnect / reconnect callbacks into outage intervals (wall-clock ns) handed to the
owner, creates the market-data stream when it is missing, and retries JetStream API calls that
time out right after a reconnect (measured: for ~0.5 s after a server restart). It knows
nothing of DBN. ``nats-py`` exceptions are translated into :class:`feeds.errors.FeedError` here.

It also checks what the server can do (:meth:`NatsSession.require_version`): the server's
version comes from its ``INFO`` greeting; JetStream consumers filtered on several subjects
need nats-server 2.10 (:data:`MULTI_FILTER_VERSION`), and an older server ignores the filter
without an error, delivering every subject of the stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from feeds.errors import FeedError
from feeds.sources.subjects import SUBJECT_ROOT

__all__ = ["MULTI_FILTER_VERSION", "NatsSession", "NatsUnavailable", "stream_subjects"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

ReconnectHook = Callable[[int, int], Awaitable[None]]
"""``(disconnected_at_ns, reconnected_at_ns)``: called on the event loop after a reconnect."""
DisconnectHook = Callable[[int], None]

MULTI_FILTER_VERSION = (2, 10, 0)
"""The first nats-server release that applies a consumer's ``filter_subjects`` (several)."""
CLOSE_TIMEOUT_S = 5.0


class NatsUnavailable(FeedError):
    """The NATS server cannot be reached (or a JetStream call kept failing)."""


def stream_subjects() -> list[str]:
    """The subjects the market-data stream records: every dataset and symbol of the bus."""
    return [f"{SUBJECT_ROOT}.>"]


def _redact_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


class NatsSession:
    """A reconnecting NATS client (``max_reconnect_attempts`` forever, 0.5 s apart).

    ``on_disconnect(at_ns)`` runs when the connection drops; ``on_reconnect(disconnected_at_ns,
    reconnected_at_ns)`` runs (awaited on the loop) once the client is back; ``nats-py`` has by
    then re-sent every core subscription, and the owner re-establishes JetStream consumers.
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        on_disconnect: DisconnectHook | None = None,
        on_reconnect: ReconnectHook | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self.name = name
        self._on_disconnect = on_disconnect
        self._on_reconnect = on_reconnect
        self._connect_timeout_s = connect_timeout_s
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._disconnected_at_ns: int | None = None
        self._closing = False
        self._last_error: Exception | None = None

    @property
    def client(self) -> Client:
        if self._nc is None:
            raise FeedError(f"{self.name}: NATS session is not connected")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise FeedError(f"{self.name}: NATS session is not connected")
        return self._js

    async def connect(self) -> None:
        """Connect, retrying for up to ``connect_timeout_s`` (a server that is starting up is
        fine); raises :class:`NatsUnavailable` naming the last error after that."""
        self._last_error = None
        try:
            self._nc = await asyncio.wait_for(
                nats.connect(
                    self.url,
                    name=self.name,
                    connect_timeout=max(1, round(self._connect_timeout_s)),
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    error_cb=self._error_cb,
                    disconnected_cb=self._disconnected_cb,
                    reconnected_cb=self._reconnected_cb,
                ),
                self._connect_timeout_s,
            )
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            reason = self._last_error or exc
            raise NatsUnavailable(
                f"{self.name}: cannot connect to {_redact_url(self.url)} within "
                f"{self._connect_timeout_s:g} s: {reason!r}"
            ) from None
        self._js = self._nc.jetstream()
        log.info("%s: connected to %s", self.name, _redact_url(self.url))

    @property
    def server_version(self) -> tuple[int, int, int] | None:
        """The version the server announced in its ``INFO`` greeting (``(0, 0, 0)`` when it
        announced none; ``None`` when it does not parse)."""
        version = self.client.connected_server_version
        try:
            return version.major, version.minor, version.patch
        except ValueError:
            return None

    def require_version(self, minimum: tuple[int, int, int], needed_for: str, remedy: str) -> None:
        """Raise :class:`FeedError` when the server is older than ``minimum`` (or announces a
        version that does not parse), naming the server, its version, ``needed_for`` and
        ``remedy``."""
        found = self.server_version
        if found is not None and found >= minimum:
            return
        announced = ".".join(map(str, found)) if found is not None else "of an unknown version"
        raise FeedError(
            f"{_redact_url(self.url)}: NATS server {announced} is older than "
            f"{'.'.join(map(str, minimum))}, which {needed_for}; {remedy}"
        )

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Drain nothing, just close (idempotent), giving up after ``timeout_s`` (a server that
        no longer reads could hold the final flush)."""
        self._closing = True
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await asyncio.wait_for(nc.close(), max(timeout_s, 0.0))
            except (OSError, TimeoutError, nats.errors.Error) as exc:
                log.debug("%s: error while closing: %r", self.name, exc)

    async def confirm_commands(self) -> None:
        """Return once the server has processed every command sent so far (subscriptions
        included), so a message published after this reaches them.

        One ``flush()`` is not enough with nats-py 2.16: its PING is written to the socket at
        once, ahead of commands still queued for the flusher task, so the PONG can come back
        before a new SUB reached the server (seen here: messages published right after a
        subscribe-and-flush were lost about once in 40 runs). The flusher writes the queue
        while the first round trip is in flight; the second PING then follows it."""
        await self.client.flush()
        await self.client.flush()

    async def ensure_stream(self, stream: str, max_age_s: float) -> None:
        """Create the market-data stream (file storage, subjects ``md.mbp10.>``) if missing.

        An existing stream is left as it is, provided it records the bus subjects; one that does
        not (another application's stream of that name) is refused with :class:`FeedError`,
        naming its subjects and the remedy, and left untouched.
        """
        js = self.js
        try:
            info = await self.retry(lambda: js.stream_info(stream))
        except nats.js.errors.NotFoundError:
            config = StreamConfig(
                name=stream,
                subjects=stream_subjects(),
                storage=StorageType.FILE,
                discard=DiscardPolicy.OLD,
                max_age=max_age_s,
            )
            await self.retry(lambda: js.add_stream(config))
            log.info("%s: created JetStream stream %s (%s)", self.name, stream, stream_subjects())
            return
        subjects = info.config.subjects or []
        if not set(stream_subjects()) <= set(subjects):
            raise FeedError(
                f"JetStream stream {stream!r} exists but records {subjects}, not {stream_subjects()}: "
                "it is not the market-data stream; set feeds.source.stream to another name (it is "
                f"created), or add {', '.join(stream_subjects())} to that stream's subjects"
            )

    async def retry(self, call: Callable[[], Awaitable[_T]], attempts: int = 20) -> _T:
        """Run a JetStream API call, retrying timeouts / no-responders for ~10 s (after a reconnect
        the server answers late for a while). Other JetStream errors propagate unchanged."""
        delay = 0.05
        attempt = 0
        while True:
            try:
                return await call()
            except nats.js.errors.NotFoundError:
                raise
            except (
                TimeoutError,
                nats.errors.TimeoutError,
                nats.errors.NoRespondersError,
                nats.js.errors.ServiceUnavailableError,
                nats.errors.ConnectionReconnectingError,
            ) as exc:
                attempt += 1
                if attempt >= attempts:
                    raise NatsUnavailable(f"{self.name}: JetStream call kept failing: {exc!r}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _error_cb(self, exc: Exception) -> None:
        self._last_error = exc
        if self._nc is None:  # still connecting: the caller reports the failure once
            log.debug("%s: connection attempt failed: %r", self.name, exc)
            return
        log.warning("%s: NATS error: %s", self.name, exc)

    async def _disconnected_cb(self) -> None:
        if self._closing:
            return
        if self._disconnected_at_ns is None:
            self._disconnected_at_ns = time.time_ns()
            log.warning("%s: disconnected from NATS", self.name)
            if self._on_disconnect is not None:
                self._on_disconnect(self._disconnected_at_ns)

    async def _reconnected_cb(self) -> None:
        now = time.time_ns()
        down_since = self._disconnected_at_ns if self._disconnected_at_ns is not None else now
        self._disconnected_at_ns = None
        log.warning("%s: reconnected to NATS after %.3f s", self.name, (now - down_since) / 1e9)
        if self._on_reconnect is not None:
            try:
                await self._on_reconnect(down_since, now)
            except Exception:
                log.exception("%s: reconnect handler failed", self.name)
