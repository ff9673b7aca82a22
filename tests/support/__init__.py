"""Reusable test doubles that are real services (a NATS server process, ...)."""
