"""Endpoint resolution and socket security shared by the control server, its client and telemetry.

Default endpoints are ipc sockets in ``<data_dir>/run``: the directory is created 0700 and each
socket file is set to 0600 once bound, so only the daemon's user can connect (DESIGN section 11).
An existing directory keeps its mode; one others may write to is refused, or with the sticky bit
(``/tmp``) accepted with a warning (:func:`prepare_ipc` says why).
tcp endpoints are only allowed with CURVE (keys in ``zmq.auth`` certificate files). The daemon's
server sockets, the control ROUTER and the telemetry PUB, are bound by one implementation of
these rules (:class:`ServerSockets`).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from agent.control.config import ControlConfig
from agent.control.errors import ControlError

__all__ = [
    "CurveClientKeys",
    "ServerSockets",
    "apply_client_keys",
    "control_endpoint",
    "ipc_path",
    "load_client_keys",
    "prepare_ipc",
    "run_dir",
    "secure_ipc",
    "telemetry_endpoint",
]

log = logging.getLogger(__name__)


class CurveClientKeys(msgspec.Struct, frozen=True):
    """A client's key pair and the server's public key (Z85 bytes)."""

    public: bytes
    secret: bytes
    server_public: bytes


def run_dir(data_dir: str) -> Path:
    return Path(data_dir) / "run"


def control_endpoint(config: ControlConfig, data_dir: str) -> str:
    return config.endpoint or f"ipc://{run_dir(data_dir) / 'control.sock'}"


def telemetry_endpoint(config: ControlConfig, data_dir: str) -> str:
    return config.telemetry_endpoint or f"ipc://{run_dir(data_dir) / 'telemetry.sock'}"


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ``ipc://`` endpoint, else None."""
    return Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None


def prepare_ipc(endpoint: str) -> None:
    """Before binding: make sure of the socket's directory and remove a stale socket file left
    by a process that died. A socket that a live process listens on is never removed
    (:class:`ControlError` naming the path), nor a file that is not a socket.

    A directory this call creates is made owner-only (0700). An existing one is left as it is
    (its mode belongs to whoever made it: ``/tmp`` must stay 1777), and judged by who else may
    write to it, since whoever can write to the directory can replace the socket file:

    * group- or world-writable without the sticky bit: refused (:class:`ControlError` naming
      the directory and its mode). Another user could remove the daemon's socket and bind their
      own in its place, and ``tradeagent ctl`` would send their commands to it.
    * group- or world-writable with the sticky bit (``/tmp``): accepted with a warning. Others
      cannot remove or rename a file they do not own there, and the socket file is made 0600
      once bound, so nobody else can connect; but while no daemon runs another user may take the
      socket's name (a daemon then refuses to start, and ``ctl`` may talk to their socket):
      a directory only this user can write to is the safe place.
    """
    path = ipc_path(endpoint)
    if path is None:
        return
    directory = path.parent
    try:
        directory.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        if not directory.is_dir():
            raise ControlError(f"{directory}: exists and is not a directory (for the socket)") from None
        _check_shared(directory)
    except OSError as exc:
        raise ControlError(f"{directory}: cannot create the socket's directory: {exc}") from None
    else:
        os.chmod(directory, 0o700)  # mkdir's mode passes through the umask
    if _listened_on(path):
        raise ControlError(
            f"{path}: a running process listens on this socket, so it was left alone "
            "(another daemon on this endpoint? give each daemon its own data_dir or endpoints)"
        )
    path.unlink(missing_ok=True)


def _check_shared(directory: Path) -> None:
    """Refuse (or warn about) an existing socket directory others may write to: see
    :func:`prepare_ipc`."""
    mode = directory.stat().st_mode
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return
    shown = f"{stat.S_IMODE(mode):04o}"
    if not mode & stat.S_ISVTX:
        raise ControlError(
            f"{directory} (mode {shown}) is writable by other users, who could replace the socket "
            "in it: put the socket in a directory only this user can write to (the default, "
            "<data_dir>/run, is created 0700)"
        )
    log.warning(
        "%s (mode %s) is shared with other users: they cannot replace the socket there, but can take "
        "its name while no daemon runs; a directory only this user can write to (the default, "
        "<data_dir>/run) is safer",
        directory,
        shown,
    )


def _listened_on(path: Path) -> bool:
    """True when a process accepts connections on the unix socket file ``path``."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise ControlError(f"{path}: exists and is not a socket; not removed (move it aside)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False  # nobody listens: left by a process that died
        except OSError as exc:
            raise ControlError(f"{path}: not removed, cannot tell whether a process listens: {exc}") from None
    return True


def secure_ipc(endpoint: str) -> None:
    """After binding: make the socket file owner-only (0600)."""
    path = ipc_path(endpoint)
    if path is not None:
        os.chmod(path, 0o600)


class ServerSockets:
    """Binds the daemon's server sockets (control ROUTER, telemetry PUB) by one rule.

    * ``ipc://``: owner-only directory, a stale socket file removed (never a live one:
      :func:`prepare_ipc`), the socket file made 0600 once bound;
    * ``tcp://``: a CURVE server with ``control.curve_server_secret_file``; one ZAP
      authenticator per context (started by the first tcp endpoint, stopped by :meth:`close`)
      admits only the client keys in ``control.curve_authorized_dir``. A client without an
      authorised key never completes the handshake: it gets no answer and no telemetry.
    """

    def __init__(self, ctx: zmq.asyncio.Context, config: ControlConfig) -> None:
        self.ctx = ctx
        self._config = config
        self._auth: AsyncioAuthenticator | None = None

    def socket(self, kind: int) -> zmq.asyncio.Socket:
        """A new socket of ``kind`` (no linger), to set options on before :meth:`bind`."""
        sock = self.ctx.socket(kind)
        sock.linger = 0
        return sock

    def bind(self, sock: zmq.asyncio.Socket, endpoint: str, what: str) -> None:
        """Secure and bind ``sock`` on ``endpoint`` (``what`` names it in errors); on failure
        the socket is closed and :class:`ControlError` says why."""
        try:
            if endpoint.startswith("tcp://"):
                self._enable_curve(sock, what)
            elif not endpoint.startswith("ipc://"):
                raise ControlError(f"{what} endpoint {endpoint!r}: only ipc:// and tcp:// (with CURVE)")
            prepare_ipc(endpoint)
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise ControlError(f"{what} endpoint {endpoint} cannot be bound: {exc}") from None
        except BaseException:
            sock.close()
            raise
        secure_ipc(endpoint)

    def _enable_curve(self, sock: zmq.asyncio.Socket, what: str) -> None:
        cfg = self._config
        if not (cfg.curve_server_secret_file and cfg.curve_authorized_dir):
            raise ControlError(f"a tcp:// {what} endpoint needs CURVE keys (control.curve_* settings)")
        try:
            public, secret = zmq.auth.load_certificate(cfg.curve_server_secret_file)
        except (OSError, ValueError) as exc:
            raise ControlError(f"control.curve_server_secret_file cannot be read: {exc}") from None
        if secret is None:
            raise ControlError(f"{cfg.curve_server_secret_file}: not a secret key certificate")
        if self._auth is None:
            self._auth = AsyncioAuthenticator(self.ctx)
            self._auth.start()
            self._auth.configure_curve(domain="*", location=cfg.curve_authorized_dir)
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    def close(self) -> None:
        """Stop the authenticator (after the sockets it served are closed)."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def load_client_keys(config: ControlConfig) -> CurveClientKeys | None:
    """The client's CURVE keys from the configured certificate files (None if not configured)."""
    if not (config.curve_client_secret_file and config.curve_server_public_file):
        return None
    try:
        public, secret = zmq.auth.load_certificate(config.curve_client_secret_file)
        server_public, _ = zmq.auth.load_certificate(config.curve_server_public_file)
    except (OSError, ValueError) as exc:
        raise ControlError(f"control CURVE key files cannot be read: {exc}") from None
    if secret is None:
        raise ControlError(f"{config.curve_client_secret_file}: not a secret key certificate")
    return CurveClientKeys(public=public, secret=secret, server_public=server_public)


def apply_client_keys(sock: zmq.Socket[bytes], keys: CurveClientKeys) -> None:
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret
    sock.curve_serverkey = keys.server_public
