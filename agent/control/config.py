"""Typed settings of the control socket, telemetry and metrics endpoints."""

from __future__ import annotations

import msgspec

__all__ = ["ControlConfig"]


class ControlConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How operators and tools reach a running daemon (DESIGN section 11).

    Empty endpoints mean the owner-only ipc sockets under ``<data_dir>/run/`` (a 0700
    directory, sockets 0600). One rule for both the control socket and telemetry: a ``tcp://``
    endpoint is refused at load unless CURVE is configured (the server's secret key file and a
    directory of authorised client public keys), and then only authorised clients connect.
    """

    endpoint: str = ""
    """Control socket (REP side in the daemon). Empty: ``ipc://<data_dir>/run/control.sock``."""
    telemetry_endpoint: str = ""
    """PUB socket for decisions, orders and fills. Empty: ``ipc://<data_dir>/run/telemetry.sock``;
    ``tcp://`` only with CURVE (subscribers use the ``curve_client_*`` settings, as ctl does)."""
    curve_server_secret_file: str = ""
    """Z85 CURVE key file of the server (``zmq.auth`` certificate format); required for tcp."""
    curve_authorized_dir: str = ""
    """Directory of client public-key certificates allowed to connect over tcp."""
    curve_client_secret_file: str = ""
    """Client side (``tradeagent ctl``): its own secret certificate, for tcp endpoints."""
    curve_server_public_file: str = ""
    """Client side: the server's public certificate, for tcp endpoints."""
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464
    """Prometheus metrics on http://metrics_host:metrics_port/metrics; 0 disables them."""
    request_timeout_s: float = 5.0
    """Client side: how long ``tradeagent ctl`` waits for an answer."""

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError("control.metrics_port must be in 0..65535")
        if self.request_timeout_s <= 0:
            raise ValueError("control.request_timeout_s must be > 0")
        curve = bool(self.curve_server_secret_file and self.curve_authorized_dir)
        for key, endpoint in (("endpoint", self.endpoint), ("telemetry_endpoint", self.telemetry_endpoint)):
            if endpoint and not endpoint.startswith(("ipc://", "tcp://")):
                raise ValueError(f"{key}: {endpoint!r}: only ipc:// and tcp:// (with CURVE) endpoints")
            if endpoint.startswith("tcp://") and not curve:
                raise ValueError(
                    f"{key}: {endpoint} is tcp:// but CURVE is not configured: set control."
                    "curve_server_secret_file and control.curve_authorized_dir (or leave it empty "
                    "for the owner-only ipc socket)"
                )
