"""Endpoint resolution and socket security shared by the control server, its client and telemetry.

Default endpoints are ipc sockets in ``<data_dir>/run``: the directory is created 0700 and each
socket file is set to 0600 once bound, so only the daemon's user can connect (DESIGN section 11).
tcp endpoints are only allowed with CURVE (keys in ``zmq.auth`` certificate files).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import zmq
import zmq.auth

from agent.control.config import ControlConfig
from agent.control.errors import ControlError

__all__ = [
    "CurveClientKeys",
    "apply_client_keys",
    "control_endpoint",
    "ipc_path",
    "load_client_keys",
    "prepare_ipc",
    "run_dir",
    "secure_ipc",
    "telemetry_endpoint",
]


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
    """Before binding: create the socket's directory owner-only (0700) and remove a stale file."""
    path = ipc_path(endpoint)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    path.unlink(missing_ok=True)


def secure_ipc(endpoint: str) -> None:
    """After binding: make the socket file owner-only (0600)."""
    path = ipc_path(endpoint)
    if path is not None:
        os.chmod(path, 0o600)


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
