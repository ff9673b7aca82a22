"""Control socket and telemetry: owner-only ipc (another user is refused), a live socket never
removed (a stale one is), tcp only with CURVE for both (only authorised keys get answers or
telemetry), and who asked reaching the handler."""

from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio
import zmq.auth
from zmq.utils.monitor import parse_monitor_message

from agent.control.client import ControlClient
from agent.control.config import ControlConfig
from agent.control.endpoints import (
    CurveClientKeys,
    ServerSockets,
    apply_client_keys,
    control_endpoint,
    ipc_path,
    load_client_keys,
    prepare_ipc,
)
from agent.control.errors import ControlError, ControlRefused, ControlUnreachable
from agent.control.messages import ControlRequest
from agent.control.server import ControlServer
from agent.daemon.telemetry import Telemetry

NOBODY = 65534

# Runs as root until it has imported what it needs, then drops to `nobody` and tries to talk to
# the daemon twice: through ControlClient, and with a raw DEALER that skips every client check.
_AS_NOBODY = r"""
import os, sys, zmq
from agent.control.client import ControlClient
from agent.control.errors import ControlUnreachable
endpoint = sys.argv[1]
os.setgid(65534); os.setuid(65534)
try:
    ControlClient(endpoint, timeout_s=1.0).request("status")
    client = "answered"
except ControlUnreachable as exc:
    client = "refused: " + str(exc)
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.linger = 0
sock.connect(endpoint)
sock.send_multipart([b"", b'{"command": "status"}'])
raw = "answered" if sock.poll(1000) else "no answer"
print(client)
print(raw)
"""


async def _status(request: ControlRequest) -> dict[str, Any]:
    if request.command == "halt":
        raise ControlRefused("already halted")
    return {"command": request.command, "args": request.args, "origin": request.origin}


@pytest.fixture
async def ipc_server() -> AsyncIterator[ControlServer]:
    # A world-traversable data dir, so only the daemon's own run dir and socket protect it.
    data_dir = tempfile.mkdtemp(prefix="tradeagent-ctl-")
    os.chmod(data_dir, 0o755)
    ctx = zmq.asyncio.Context()
    servers = ServerSockets(ctx, ControlConfig())
    server = ControlServer(servers, control_endpoint(ControlConfig(), data_dir), _status)
    server.start()
    try:
        yield server
    finally:
        await server.close()
        servers.close()
        ctx.destroy(linger=0)


def _ask(endpoint: str, command: str = "status", **kw: Any) -> dict[str, Any]:
    return ControlClient(endpoint, timeout_s=2.0, **kw).request(command)  # type: ignore[arg-type]


async def test_ipc_socket_is_owner_only_and_answers_its_owner(ipc_server: ControlServer) -> None:
    path = ipc_path(ipc_server.endpoint)
    assert path is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    result = await asyncio.to_thread(_ask, ipc_server.endpoint)
    assert result == {
        "command": "status",
        "args": {},
        "origin": f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}",
    }
    with pytest.raises(ControlRefused, match="already halted"):
        await asyncio.to_thread(_ask, ipc_server.endpoint, "halt")


def _run_as_nobody(endpoint: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _AS_NOBODY, endpoint], capture_output=True, text=True, timeout=30, check=True
    )
    return proc.stdout.strip().splitlines()


async def test_a_client_of_another_user_is_refused(ipc_server: ControlServer) -> None:
    path = ipc_path(ipc_server.endpoint)
    assert path is not None
    client, raw = await asyncio.to_thread(_run_as_nobody, ipc_server.endpoint)
    assert client.startswith("refused") and "permission denied" in client
    assert raw == "no answer"
    # The same user-switching probe does get through once the permissions are opened up,
    # so the refusal above is the permissions' doing.
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o666)
    client, raw = await asyncio.to_thread(_run_as_nobody, ipc_server.endpoint)
    assert (client, raw) == ("answered", "answered")


async def test_a_shared_sticky_directory_keeps_its_mode_and_the_socket_stays_owner_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A socket in a directory like ``/tmp`` (1777): the directory is not locked down, a warning
    says what remains, and the socket file alone keeps other users out."""
    shared = Path(tempfile.mkdtemp(prefix="tradeagent-shared-"))
    os.chmod(shared, 0o1777)
    endpoint = f"ipc://{shared / 'control.sock'}"
    ctx = zmq.asyncio.Context()
    servers = ServerSockets(ctx, ControlConfig())
    server = ControlServer(servers, endpoint, _status)
    try:
        server.start()
        assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
        assert stat.S_IMODE((shared / "control.sock").stat().st_mode) == 0o600
        warning = f"{shared} (mode 1777) is shared with other users: they cannot replace the socket"
        assert warning in caplog.text
        assert (await asyncio.to_thread(_ask, endpoint))["command"] == "status"
        client, raw = await asyncio.to_thread(_run_as_nobody, endpoint)
        assert client.startswith("refused") and "permission denied" in client
        assert raw == "no answer"
    finally:
        await server.close()
        servers.close()
        ctx.destroy(linger=0)
        shutil.rmtree(shared)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_directory_others_may_write_to_is_refused_and_left_alone(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    os.chmod(shared, mode)
    with pytest.raises(ControlError) as refused:
        prepare_ipc(f"ipc://{shared / 'control.sock'}")
    assert str(refused.value).startswith(
        f"{shared} (mode {mode:04o}) is writable by other users, who could replace the socket in it"
    )
    assert stat.S_IMODE(shared.stat().st_mode) == mode
    assert list(shared.iterdir()) == []


def test_only_a_directory_it_creates_is_made_owner_only(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        mine = tmp_path / "a" / "run"
        prepare_ipc(f"ipc://{mine / 'control.sock'}")
        assert stat.S_IMODE(mine.stat().st_mode) == 0o700
        existing = tmp_path / "b"
        existing.mkdir()
        os.chmod(existing, 0o755)  # others may read it, not write to it: used as it is
        prepare_ipc(f"ipc://{existing / 'control.sock'}")
        assert stat.S_IMODE(existing.stat().st_mode) == 0o755
    finally:
        os.umask(previous)


def _free_tcp() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class _Curve:
    """A server certificate, an authorised client and a stranger (``zmq.auth`` files)."""

    def __init__(self, tmp_path: Path) -> None:
        keys, self.authorized, strangers = tmp_path / "keys", tmp_path / "authorized", tmp_path / "strangers"
        for d in (keys, self.authorized, strangers):
            d.mkdir()
        _, self.server_secret = zmq.auth.create_certificates(keys, "server")
        client_public, self.client_secret = zmq.auth.create_certificates(keys, "client")
        _, stranger_secret = zmq.auth.create_certificates(strangers, "stranger")
        os.rename(client_public, self.authorized / "client.key")
        self.server_public = keys / "server.key"
        public, secret = zmq.auth.load_certificate(stranger_secret)
        assert secret is not None
        self.stranger = (public, secret)

    def config(self, **endpoints: str) -> ControlConfig:
        return ControlConfig(
            **endpoints,
            curve_server_secret_file=str(self.server_secret),
            curve_authorized_dir=str(self.authorized),
            curve_client_secret_file=str(self.client_secret),
            curve_server_public_file=str(self.server_public),
        )


async def test_tcp_requires_curve_and_refuses_unauthenticated_clients(tmp_path: Path) -> None:
    curve = _Curve(tmp_path)
    endpoint = _free_tcp()
    with pytest.raises(ValueError, match="CURVE"):
        ControlConfig(endpoint=endpoint)
    config = curve.config(endpoint=endpoint)
    ctx = zmq.asyncio.Context()
    servers = ServerSockets(ctx, config)
    server = ControlServer(servers, endpoint, _status)
    server.start()
    try:
        good = load_client_keys(config)
        assert good is not None
        answer = await asyncio.to_thread(_ask, endpoint, curve=good)
        assert answer["command"] == "status"
        # Who asked: what the client says, and the key it authenticated with.
        assert answer["origin"].endswith(
            f"pid {os.getpid()} (CURVE key {good.public.decode()} from 127.0.0.1)"
        )
        # No keys at all: the client refuses to send in clear...
        with pytest.raises(ControlUnreachable, match="CURVE"):
            await asyncio.to_thread(_ask, endpoint)
        # ...and a raw plaintext DEALER never gets an answer.
        plain = ctx.socket(zmq.DEALER)
        plain.linger = 0
        plain.connect(endpoint)
        await plain.send_multipart([b"", b'{"command": "status"}'])
        assert not await plain.poll(1000)
        plain.close()
        # A CURVE client whose key is not authorised is refused too.
        stranger = CurveClientKeys(
            public=curve.stranger[0], secret=curve.stranger[1], server_public=good.server_public
        )
        with pytest.raises(ControlUnreachable, match="no answer"):
            await asyncio.to_thread(lambda: ControlClient(endpoint, 1.0, stranger).request("status"))
    finally:
        await server.close()
        servers.close()
        ctx.destroy(linger=0)


async def _handshake(monitor: zmq.asyncio.Socket) -> str:
    """The outcome of a subscriber's first CURVE handshake, from its socket monitor."""
    async with asyncio.timeout(10):
        while True:
            event = zmq.Event(parse_monitor_message(await monitor.recv_multipart())["event"]).name
            if event is not None and event.startswith("HANDSHAKE"):
                return event


async def test_telemetry_over_tcp_reaches_only_authorised_subscribers(tmp_path: Path) -> None:
    """One rule for control and telemetry: both tcp endpoints on one context share one
    authenticator; a plaintext or unauthorised subscriber fails the handshake and gets nothing."""
    curve = _Curve(tmp_path)
    control, publish = _free_tcp(), _free_tcp()
    with pytest.raises(ValueError, match=r"telemetry_endpoint: .* CURVE is not configured"):
        ControlConfig(telemetry_endpoint=publish)
    config = curve.config(endpoint=control, telemetry_endpoint=publish)
    ctx = zmq.asyncio.Context()
    servers = ServerSockets(ctx, config)
    server = ControlServer(servers, control, _status)
    server.start()
    telemetry = Telemetry(servers, publish)
    good = load_client_keys(config)
    assert good is not None
    subscribers: dict[str, zmq.asyncio.Socket] = {}
    outcomes: dict[str, str] = {}
    try:
        for name, keys in (
            ("authorised", good),
            (
                "stranger",
                CurveClientKeys(
                    public=curve.stranger[0], secret=curve.stranger[1], server_public=good.server_public
                ),
            ),
            ("plaintext", None),
        ):
            sub = subscribers[name] = ctx.socket(zmq.SUB)
            sub.linger = 0
            sub.subscribe(b"")
            if keys is not None:
                apply_client_keys(sub, keys)
            monitor = sub.get_monitor_socket()
            sub.connect(publish)
            outcomes[name] = await _handshake(monitor)
            sub.disable_monitor()
        assert outcomes == {
            "authorised": "HANDSHAKE_SUCCEEDED",
            "stranger": "HANDSHAKE_FAILED_AUTH",
            "plaintext": "HANDSHAKE_FAILED_PROTOCOL",
        }
        got: list[bytes] = []
        for _ in range(100):  # the subscription reaches the PUB shortly after the handshake
            telemetry.publish("fill", {"qty": 2})
            if await subscribers["authorised"].poll(20):
                got = await subscribers["authorised"].recv_multipart()
                break
        assert got == [b"fill", b'{"qty":2}']
        assert not await subscribers["stranger"].poll(0) and not await subscribers["plaintext"].poll(0)
        assert (await asyncio.to_thread(_ask, control, curve=good))["command"] == "status"
    finally:
        for sub in subscribers.values():
            sub.close(linger=0)
        telemetry.close()
        await server.close()
        servers.close()
        ctx.destroy(linger=0)


async def test_a_live_socket_is_never_removed(ipc_server: ControlServer) -> None:
    """A second server on the endpoint of a running one is refused before it touches the socket
    file; the running one still answers."""
    path = ipc_path(ipc_server.endpoint)
    assert path is not None
    ctx = zmq.asyncio.Context()
    intruder = ServerSockets(ctx, ControlConfig())
    try:
        with pytest.raises(ControlError, match=f"{path}: a running process listens on this socket"):
            ControlServer(intruder, ipc_server.endpoint, _status).start()
        with pytest.raises(ControlError, match="a running process listens"):
            Telemetry(intruder, ipc_server.endpoint)
    finally:
        intruder.close()
        ctx.destroy(linger=0)
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert (await asyncio.to_thread(_ask, ipc_server.endpoint))["command"] == "status"


def test_a_stale_socket_file_is_removed_and_other_files_are_not(tmp_path: Path) -> None:
    path = tmp_path / "run" / "control.sock"
    path.parent.mkdir()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # what a process that died leaves: the file, nobody listening
    dead.close()
    assert stat.S_ISSOCK(path.stat().st_mode)
    prepare_ipc(f"ipc://{path}")
    assert not path.exists()
    path.write_text("not a socket", encoding="utf-8")
    with pytest.raises(ControlError, match="not a socket; not removed"):
        prepare_ipc(f"ipc://{path}")
    assert path.read_text(encoding="utf-8") == "not a socket"


def test_client_reports_a_missing_daemon(tmp_path: Path) -> None:
    endpoint = control_endpoint(ControlConfig(), str(tmp_path))
    with pytest.raises(ControlUnreachable, match="is the daemon running"):
        ControlClient(endpoint, timeout_s=0.5).request("status")
