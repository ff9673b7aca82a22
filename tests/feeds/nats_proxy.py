"""A TCP proxy speaking the NATS client protocol, in front of a real ``nats-server``.

The outer edge of the feed-safety tests: the client under test connects to the proxy, the proxy
to the real server, and every protocol operation passes through unchanged except where the test
asks the proxy to behave like another server:

* ``version``: the ``INFO`` greetings announce this server version (an older nats-server, as
  the client sees it);
* ``strip_filters``: consumer-create requests lose their ``filter_subjects`` field on the way,
  which is what a nats-server before 2.10 does with it (the field is unknown to it, so the
  consumer delivers every subject of the stream);
* :meth:`NatsProxy.freeze`: from then on nothing is forwarded either way, the connections stay
  open (a server that hangs: acknowledgements never come).

It runs its own event loop on a thread, so both asyncio tests and tests driving subprocesses
can use it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["NatsProxy"]

_PAYLOAD_OPS = {b"PUB", b"HPUB", b"MSG", b"HMSG"}
"""Operations followed by a payload whose size is the last argument of the line."""
_CONSUMER_CREATE = "$JS.API.CONSUMER.CREATE."
Rewrite = Callable[[bytes, list[bytes], bytes], bytes]
"""(protocol line, its fields, its payload with CRLF or b"") -> the bytes to forward."""


class NatsProxy:
    """Forward 127.0.0.1:<port> to ``upstream_port`` (see the module docstring)."""

    def __init__(
        self, upstream_port: int, *, version: str | None = None, strip_filters: bool = False
    ) -> None:
        self.upstream_port = upstream_port
        self.version = version
        self.strip_filters = strip_filters
        self.port = 0
        self.stripped = 0
        """Consumer-create requests whose filter was removed."""
        self.held = 0
        """Operations from clients held back since :meth:`freeze`."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._frozen = threading.Event()
        self._thaw: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def __enter__(self) -> NatsProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def freeze(self) -> None:
        """Stop forwarding, both ways, for good."""
        self._frozen.set()

    async def _listen(self) -> None:
        self._thaw = asyncio.Event()  # never set: a frozen pump waits on it forever
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in asyncio.all_tasks(self._loop) - {asyncio.current_task()}:
            task.cancel()

    async def _connection(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        server_in, server_out = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        pumps = [
            asyncio.create_task(self._pump(server_in, client_out, self._from_server)),
            asyncio.create_task(self._pump(client_in, server_out, self._from_client)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            for writer in (client_out, server_out):
                writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rewrite: Rewrite
    ) -> None:
        assert self._thaw is not None
        while True:
            line = await reader.readline()
            if not line:
                return
            fields = line.split()
            payload = b""
            if fields and fields[0].upper() in _PAYLOAD_OPS:
                payload = await reader.readexactly(int(fields[-1]) + 2)
            if self._frozen.is_set():
                if rewrite == self._from_client:
                    self.held += 1
                await self._thaw.wait()
            writer.write(rewrite(line, fields, payload))
            await writer.drain()

    def _from_server(self, line: bytes, fields: list[bytes], payload: bytes) -> bytes:
        if self.version is None or not fields or fields[0].upper() != b"INFO":
            return line + payload
        info = json.loads(line[len(fields[0]) :])
        info["version"] = self.version
        return b"INFO " + json.dumps(info).encode() + b"\r\n"

    def _from_client(self, line: bytes, fields: list[bytes], payload: bytes) -> bytes:
        op = fields[0].upper() if fields else b""
        if not (self.strip_filters and op == b"PUB" and fields[1].decode().startswith(_CONSUMER_CREATE)):
            return line + payload
        request = json.loads(payload[:-2])
        if request.get("config", {}).pop("filter_subjects", None) is None:
            return line + payload
        self.stripped += 1
        body = json.dumps(request).encode()
        return b" ".join([*fields[:-1], str(len(body)).encode()]) + b"\r\n" + body + b"\r\n"
