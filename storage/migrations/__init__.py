"""Alembic migrations of the tradeagent schema (``script_location = storage:migrations``)."""
