"""The tests' real ``nats-server``: :class:`NatsServer` is the product's own
(:mod:`feeds.natsd`, which ``tradeagent demo`` and the benchmarks start too); the tests and the
``nats_server`` fixture (tests/conftest.py) take it from here."""

from feeds.natsd import NatsServer, NatsServerUnavailable, find_nats_server

__all__ = ["NatsServer", "NatsServerUnavailable", "find_nats_server"]
