"""Control socket: owner-only ipc (another user is refused), tcp only with CURVE, commands."""

from __future__ import annotations

import asyncio
import os
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

from agent.control.client import ControlClient
from agent.control.config import ControlConfig
from agent.control.endpoints import CurveClientKeys, control_endpoint, ipc_path, load_client_keys
from agent.control.errors import ControlRefused, ControlUnreachable
from agent.control.messages import ControlRequest
from agent.control.server import ControlServer

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
    return {"command": request.command, "args": request.args}


@pytest.fixture
async def ipc_server() -> AsyncIterator[ControlServer]:
    # A world-traversable data dir, so only the daemon's own run dir and socket protect it.
    data_dir = tempfile.mkdtemp(prefix="tradeagent-ctl-")
    os.chmod(data_dir, 0o755)
    ctx = zmq.asyncio.Context()
    server = ControlServer(ctx, control_endpoint(ControlConfig(), data_dir), ControlConfig(), _status)
    server.start()
    try:
        yield server
    finally:
        await server.close()
        ctx.destroy(linger=0)


def _ask(endpoint: str, command: str = "status", **kw: Any) -> dict[str, Any]:
    return ControlClient(endpoint, timeout_s=2.0, **kw).request(command)  # type: ignore[arg-type]


async def test_ipc_socket_is_owner_only_and_answers_its_owner(ipc_server: ControlServer) -> None:
    path = ipc_path(ipc_server.endpoint)
    assert path is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    result = await asyncio.to_thread(_ask, ipc_server.endpoint)
    assert result == {"command": "status", "args": {}}
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


def _free_tcp() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


async def test_tcp_requires_curve_and_refuses_unauthenticated_clients(tmp_path: Path) -> None:
    keys, authorized, strangers = tmp_path / "keys", tmp_path / "authorized", tmp_path / "strangers"
    for d in (keys, authorized, strangers):
        d.mkdir()
    _, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, client_secret = zmq.auth.create_certificates(keys, "client")
    _, stranger_secret = zmq.auth.create_certificates(strangers, "stranger")
    os.rename(client_public, authorized / "client.key")
    endpoint = _free_tcp()
    with pytest.raises(ValueError, match="CURVE"):
        ControlConfig(endpoint=endpoint)
    config = ControlConfig(
        endpoint=endpoint,
        curve_server_secret_file=str(server_secret),
        curve_authorized_dir=str(authorized),
        curve_client_secret_file=str(client_secret),
        curve_server_public_file=str(keys / "server.key"),
    )
    ctx = zmq.asyncio.Context()
    server = ControlServer(ctx, endpoint, config, _status)
    server.start()
    try:
        good = load_client_keys(config)
        assert good is not None
        assert (await asyncio.to_thread(_ask, endpoint, curve=good))["command"] == "status"
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
        public, secret = zmq.auth.load_certificate(stranger_secret)
        assert secret is not None
        stranger = CurveClientKeys(public=public, secret=secret, server_public=good.server_public)
        with pytest.raises(ControlUnreachable, match="no answer"):
            await asyncio.to_thread(lambda: ControlClient(endpoint, 1.0, stranger).request("status"))
    finally:
        await server.close()
        ctx.destroy(linger=0)


def test_client_reports_a_missing_daemon(tmp_path: Path) -> None:
    endpoint = control_endpoint(ControlConfig(), str(tmp_path))
    with pytest.raises(ControlUnreachable, match="is the daemon running"):
        ControlClient(endpoint, timeout_s=0.5).request("status")
