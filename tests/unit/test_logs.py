from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from agent.logs import redact, setup_logging


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connect postgresql+psycopg://trader:hunter2@db:5432/prod", "hunter2"),
        ("api_key=db-ABCDEF123 loaded", "db-ABCDEF123"),
        ("token: s3cr3t, next", "s3cr3t"),
        ("PASSWORD=pw1;", "pw1"),
    ],
)
def test_redact_hides_secrets(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out
    assert "***" in out


def test_json_lines_are_redacted_and_follow_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        setup_logging("json")
        buffer = io.StringIO()
        monkeypatch.setattr(sys, "stderr", buffer)
        logging.getLogger("tradeagent.test").warning("url %s", "nats://u:pw@127.0.0.1:4222")
        line = json.loads(buffer.getvalue())
        assert line["level"] == "warning"
        assert line["msg"] == "url nats://u:***@127.0.0.1:4222"
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
