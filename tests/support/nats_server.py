"""The tests' real ``nats-server``: :class:`NatsServer` is implemented in
:mod:`agent.bench.nats_server`, because ``tradeagent bench feed`` starts one too; the tests and
the ``nats_server`` fixture (tests/conftest.py) take it from here."""

from agent.bench.nats_server import NatsServer, NatsServerUnavailable, find_nats_server

__all__ = ["NatsServer", "NatsServerUnavailable", "find_nats_server"]
